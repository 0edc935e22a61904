"""Completion store edges that need no database: URLs, settings, arguments, SQL building."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from leaseworker import (
    Completion,
    CompletionRequest,
    ConfigError,
    StoreUnavailable,
    fenced_upsert,
    open_store,
)
from leaseworker._store import MIGRATIONS, parse_store_url, pending, redact


@pytest.mark.parametrize(
    "url",
    [
        "mysql://db/x",
        "redis://localhost",
        "completions.db",
        "sqlite://",
        "sqlite:///",
        "sqlite://host/c.db",
        "sqlite:///c.db?mode=ro",
        "memory://name",
        "memory:",
        "postgresql://u:pw@db/x?no_such_option=1",
    ],
)
def test_bad_urls_are_config_errors_without_the_password(url: str) -> None:
    """A URL no backend can take is a ConfigError at start, and the message masks passwords."""
    with pytest.raises(ConfigError) as failed:
        parse_store_url(url)
    assert ":pw@" not in str(failed.value)


@pytest.mark.parametrize(
    ("url", "backend", "target"),
    [
        ("sqlite:///c.db", "sqlite", "c.db"),
        ("sqlite:////var/lib/c.db", "sqlite", "/var/lib/c.db"),
        ("sqlite:///:memory:", "sqlite", ":memory:"),
        ("memory://", "memory", ""),
        ("postgres://db/x", "postgresql", "postgres://db/x"),
        ("postgresql://u:pw@db:5432/x", "postgresql", "postgresql://u:pw@db:5432/x"),
    ],
)
def test_urls_select_the_backend(url: str, backend: str, target: str) -> None:
    """The scheme picks the backend; SQLite paths follow SQLAlchemy's three/four slashes."""
    parsed = parse_store_url(url)
    assert (parsed.backend, parsed.target) == (backend, target)
    assert "pw" not in repr(parsed)


def test_redact_masks_userinfo_and_query_passwords() -> None:
    """Both places a libpq URL can carry a password are masked."""
    assert redact("postgresql://lw:s3cr%40t@db/x") == "postgresql://lw:***@db/x"
    assert redact("postgresql://db/x?user=lw&password=s3cret") == (
        "postgresql://db/x?user=lw&password=***"
    )
    assert redact("postgresql://lw@db/x") == "postgresql://lw@db/x"


@pytest.mark.parametrize(
    "settings",
    [{"call_timeout": 0}, {"call_timeout": float("inf")}, {"max_connections": 0}],
)
async def test_bad_settings_are_config_errors_before_any_io(settings: dict[str, float]) -> None:
    """Settings that cannot bound the calls are refused before touching a database."""
    with pytest.raises(ConfigError):
        async with open_store("postgresql://nobody@127.0.0.1:1/x", **settings):  # type: ignore[arg-type]
            pytest.fail("opened with bad settings")


@pytest.mark.parametrize("url", ["sqlite:///:memory:", "memory://"])
async def test_bad_arguments_are_refused_before_any_io(url: str) -> None:
    """An empty job key or a result that is not JSON fails fast, without quoting the payload."""
    async with open_store(url) as store:
        with pytest.raises(ConfigError, match="job key"):
            await store.lookup("", "v")
        with pytest.raises(TypeError, match="not JSON-serialisable") as failed:
            await store.complete(
                CompletionRequest(
                    job_key="k",
                    input_version="v",
                    fence=1,
                    result={"nan": float("nan")},
                    execution_id="e",
                    pod="p",
                )
            )
        assert "nan" not in str(failed.value).replace("JSON", "")
        assert await store.state("k") is None


def test_completion_and_request_reprs_leave_out_the_result() -> None:
    """Results may carry personal data; reprs end up in logs."""
    completion = Completion(
        job_key="k",
        input_version="v",
        fence=1,
        result={"email": "someone@example.com"},
        execution_id="e",
        pod="p",
        completed_at=datetime(2026, 11, 1, tzinfo=UTC),
    )
    assert "someone" not in repr(completion)
    request = CompletionRequest(
        job_key="k",
        input_version="v",
        fence=1,
        result={"email": "someone@example.com"},
        execution_id="e",
        pod="p",
    )
    assert "someone" not in repr(request)


def test_migrations_must_be_numbered_without_gaps() -> None:
    """The highest applied version only describes a database if versions run 1..n."""
    assert pending(0) == list(MIGRATIONS)
    assert pending(len(MIGRATIONS)) == []
    with pytest.raises(ValueError, match=r"1\.\.n"):
        pending(0, [MIGRATIONS[0], MIGRATIONS[0]])


def test_fenced_upsert_quotes_names_and_refuses_others() -> None:
    """Names are checked and double-quoted, so the SQL cannot be injected into."""
    sql = fenced_upsert("app.report", key=["id"], columns=["total"], paramstyle="named")
    assert sql.startswith('INSERT INTO "app"."report" AS cur ("id", "total", "fence")')
    assert 'WHERE cur."fence" <= EXCLUDED."fence"' in sql
    assert ":total" in sql
    bad_args: list[dict[str, object]] = [
        {"table": "report; DROP TABLE x"},
        {"key": []},
        {"columns": ["id"]},
    ]
    for bad in bad_args:
        args: dict[str, object] = {"table": "report", "key": ["id"], "columns": ["total"]}
        args.update(bad)
        with pytest.raises(ValueError):  # noqa: PT011 - the message varies by mistake
            fenced_upsert(args["table"], key=args["key"], columns=args["columns"])  # type: ignore[arg-type]


async def test_memory_store_says_it_is_not_durable_and_refuses_calls_once_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``memory://`` warns at open that nothing outlives the process; closed, it fails calls."""
    async with open_store("memory://") as store:
        await store.complete(
            CompletionRequest(
                job_key="k", input_version="v", fence=1, result=[1], execution_id="e", pod="p"
            )
        )
        found = await store.lookup("k", "v")
        assert found is not None
        found.result.append(2)  # the caller's copy: the store's record is unchanged
        again = await store.lookup("k", "v")
        assert again is not None
        assert again.result == [1]
    assert any(r.__dict__.get("event") == "store_not_durable" for r in caplog.records)
    with pytest.raises(StoreUnavailable, match="closed"):
        await store.lookup("k", "v")
