"""``leaseworker inspect KEY`` shows the completion state next to the lease."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import anyio
import pytest

from leaseworker import CompletionRequest, open_store
from leaseworker._cli import main
from leaseworker._execution import completion_key
from leaseworker_dev._services import LocalRedis, free_port


def _inspect(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["inspect", *argv]) == 0
    shown: dict[str, object] = json.loads(capsys.readouterr().out)
    return shown


def test_inspect_shows_the_winning_completion_and_the_result_only_on_request(
    redis_server: LocalRedis, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Winning fence, input version, completed_at, execution id and pod; no result by default."""
    namespace, key = f"t{uuid.uuid4().hex[:12]}", "report:acme:2026-11"

    async def record() -> None:
        async with open_store(store_url) as store:
            for fence, version in ((10, "v1"), (20, "v2")):
                await store.complete(
                    CompletionRequest(
                        job_key=completion_key(namespace, key),
                        input_version=version,
                        fence=fence,
                        result={"total": fence},
                        execution_id=f"e{fence}",
                        pod="pod-b",
                    )
                )

    anyio.run(record)
    argv = [key, "--redis-url", redis_server.url, "--namespace", namespace]
    shown = _inspect(capsys, *argv, "--store-url", store_url)
    assert shown["owner"] is None  # no lease held right now
    completion = shown["completion"]
    assert isinstance(completion, dict)
    assert completion["state"] == "completed"
    assert completion["winning_fence"] == 20
    assert completion["input_version"] == "v2"
    assert (completion["execution_id"], completion["pod"]) == ("e20", "pod-b")
    assert str(completion["completed_at"]).endswith("+00:00")
    assert "result" not in completion
    shown = _inspect(capsys, *argv, "--store-url", store_url, "--show-result")
    assert isinstance(shown["completion"], dict)
    assert shown["completion"]["result"] == {"total": 20}
    other = _inspect(capsys, *argv[:3], "--namespace", "elsewhere", "--store-url", store_url)
    assert other["completion"] is None  # another namespace's fences are another story


def test_inspect_cuts_a_long_result_and_says_so(
    redis_server: LocalRedis, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A result longer than --result-limit is a preview, flagged, with its full length."""
    namespace, key = f"t{uuid.uuid4().hex[:12]}", "report:long"
    store_url = f"sqlite:///{tmp_path / 'completions.sqlite3'}"

    async def record() -> None:
        async with open_store(store_url) as store:
            await store.complete(
                CompletionRequest(
                    job_key=completion_key(namespace, key),
                    input_version="v",
                    fence=1,
                    result={"rows": "x" * 10_000},
                    execution_id="e1",
                    pod="pod-b",
                )
            )

    anyio.run(record)
    argv = [key, "--redis-url", redis_server.url, "--namespace", namespace]
    argv += ["--store-url", store_url, "--show-result"]
    assert main(["inspect", *argv]) == 0
    out, err = capsys.readouterr()
    completion = json.loads(out)["completion"]
    assert "result" not in completion
    assert completion["result_truncated"] is True
    assert completion["result_characters"] == len('{"rows": ""}') + 10_000
    assert completion["result_preview"] == ('{"rows": "' + "x" * 10_000)[:4096]
    assert "result_preview shows the first 4096" in err
    shown = _inspect(capsys, *argv, "--result-limit", "0")
    assert isinstance(shown["completion"], dict)
    assert shown["completion"]["result"] == {"rows": "x" * 10_000}


def test_inspect_never_creates_a_missing_sqlite_store(
    redis_server: LocalRedis, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Looking at a store that does not exist says "no completion" and leaves no file."""
    path = tmp_path / "absent.sqlite3"
    shown = _inspect(
        capsys, "k", "--redis-url", redis_server.url, "--store-url", f"sqlite:///{path}"
    )
    assert shown["completion"] is None
    assert not path.exists()


def test_inspect_of_a_memory_store_shows_no_completion_and_opens_nothing(
    redis_server: LocalRedis, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """``memory://`` lives inside each pod: another process has nothing to look at."""
    shown = _inspect(capsys, "k", "--redis-url", redis_server.url, "--store-url", "memory://")
    assert shown["completion"] is None
    assert not any(r.__dict__.get("event") == "store_not_durable" for r in caplog.records)


def test_inspect_with_a_bad_store_url_exits_2_with_one_line(
    redis_server: LocalRedis, capsys: pytest.CaptureFixture[str]
) -> None:
    """A malformed URL is a usage error, not a traceback."""
    code = main(["inspect", "k", "--redis-url", redis_server.url, "--store-url", "mysql://x"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("leaseworker inspect: error:")
    assert "\n" not in err


@pytest.mark.parametrize(
    ("redis_url", "says"),
    [
        ("redis://127.0.0.1:{free}/0", "unavailable"),  # nobody listens there
        ("redis://:s3cret@127.0.0.1:notaport/0", "not a valid Redis URL"),
    ],
)
def test_inspect_with_redis_unreachable_or_malformed_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], redis_url: str, says: str
) -> None:
    """No traceback, one line, and never the URL's password.

    The free port is picked when the test runs: picked at collection, it would
    differ between pytest-xdist's workers, which must collect the same tests.
    """
    redis_url = redis_url.replace("{free}", str(free_port()))
    code = main(["inspect", "k", "--redis-url", redis_url, "--store-url", "memory://"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("leaseworker inspect: error:")
    assert says in err
    assert "\n" not in err
    assert "s3cret" not in err


def test_inspect_shows_what_the_winning_execution_spent_in_its_children(
    redis_server: LocalRedis, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """CPU seconds and peak memory of its run_in_process calls, as JSON and as text."""
    namespace, key = f"t{uuid.uuid4().hex[:12]}", "report:acme:2026-11"

    async def record() -> None:
        async with open_store(store_url) as store:
            await store.complete(
                CompletionRequest(
                    job_key=completion_key(namespace, key),
                    input_version="v1",
                    fence=10,
                    result={},
                    execution_id="e10",
                    pod="pod-b",
                    cpu_seconds=1.5,
                    peak_memory=40 * 2**20,
                )
            )

    anyio.run(record)
    argv = [
        key,
        "--redis-url",
        redis_server.url,
        "--namespace",
        namespace,
        "--store-url",
        store_url,
    ]
    completion = _inspect(capsys, *argv)["completion"]
    assert isinstance(completion, dict)
    assert (completion["cpu_seconds"], completion["peak_memory"]) == (1.5, 40 * 2**20)
    assert main(["inspect", *argv, "--text"]) == 0
    (line,) = [
        line for line in capsys.readouterr().out.splitlines() if line.startswith("completion")
    ]
    assert line.endswith("execution e10 on pod-b, CPU 1.500s, peak 40.0 MiB in run_in_process")
