"""``leaseworker demo`` leaves nothing behind: no process, no directory, whatever stops it.

Each demo here runs with a private ``TMPDIR``, so "no directory left" is
"that directory is empty"; the processes it started are read from /proc
(children of the demo, by pid and start time) before the signal and must all
be gone once it exited. ``demo services`` (the stack alone, about 5 s) takes
each of SIGTERM, SIGHUP and SIGINT while it waits; the full stack demo takes a
SIGTERM mid-run, with its three pods up.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from leaseworker import CompletionRequest, open_store
from leaseworker._cli import main
from leaseworker_dev._cli._demo_command import _stop_signals_interrupt

from ..processes import Spawned, alive, ended, start, stop_all


@pytest.fixture
def demo() -> Iterator[list[Spawned]]:
    """Demos started by the test; whatever a failing test left running is stopped."""
    started: list[Spawned] = []
    yield started
    stop_all(started)


def _start(started: list[Spawned], tmp_path: Path, *args: str) -> Spawned:
    return start(started, tmp_path, "demo", *args)


@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=["TERM", "HUP", "INT"]
)
def test_each_stop_signal_stops_the_services_and_removes_their_directories(
    demo: list[Spawned], tmp_path: Path, signum: signal.Signals
) -> None:
    """``demo services`` up (Redis, Kafka, maybe Jaeger): the signal leaves nothing behind."""
    one = _start(demo, tmp_path, "services")
    one.wait_for("press Ctrl-C")
    services = one.children()
    assert len(services) >= 2  # redis-server and Kafka's JVM at least
    assert any(one.tmp.iterdir())
    one.process.send_signal(signum)
    assert ended(one) == 0, one.seen
    assert "stopping the services" in one.seen
    assert not alive(services)
    assert not list(one.tmp.iterdir())


@pytest.mark.parametrize(
    ("flags", "servers"),
    [(["--postgres"], 1), (["--postgres-standby", "sync"], 2)],
    ids=["single", "standby"],
)
def test_services_with_postgres_print_a_store_url_that_works_and_stop_it_too(
    demo: list[Spawned], flags: list[str], servers: int
) -> None:
    """``demo services --postgres``: its URL opens a store; Ctrl-C stops it with the rest.

    With ``--postgres-standby sync`` the URL names the primary and its standby.
    """
    # Under the session's TMPDIR: the server runs as the postgres OS user when root, and
    # pytest's own tmp_path is not enterable by it.
    root = Path(tempfile.mkdtemp(prefix="lwdemo-"))
    root.chmod(0o711)
    try:
        one = _start(demo, root, "services", *flags)
        one.wait_for("press Ctrl-C")
        assert any(", PostgreSQL postgresql://" in line for line in one.seen), one.seen
        [store] = [line for line in one.seen if line.startswith("  store: ")]
        url = store.split("--store-url ", 1)[1]
        assert url.count("127.0.0.1:") == servers
        services = one.children()
        names = [Path(f"/proc/{pid}/comm").read_text().strip() for pid, _ in services]
        assert "redis-server" in names
        assert names.count("postgres") == servers
        anyio.run(_complete_once, url)
        one.process.send_signal(signal.SIGINT)
        assert ended(one) == 0, one.seen
        assert not alive(services)
        assert not list(one.tmp.iterdir())
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def _complete_once(url: str) -> None:
    """Open the store at ``url`` (its schema made on first use) and record one completion."""
    async with open_store(url) as store:
        request = CompletionRequest(
            job_key="demo:{k}", input_version="v1", fence=1, result={}, execution_id="e", pod="p"
        )
        assert (await store.complete(request)).status == "accepted"


def test_services_with_three_brokers_list_them_all_and_stop_them_too(
    demo: list[Spawned], tmp_path: Path
) -> None:
    """``demo services --kafka-brokers 3``: three bootstrap addresses, three JVMs, all stopped."""
    one = _start(demo, tmp_path, "services", "--kafka-brokers", "3")
    one.wait_for("press Ctrl-C")
    [line] = [line for line in one.seen if line.startswith("  Kafka ")]
    assert len(line.split()[1].rstrip(",").split(",")) == 3, line
    services = one.children()
    names = [Path(f"/proc/{pid}/comm").read_text().strip() for pid, _ in services]
    assert names.count("java") == 3, names
    one.process.send_signal(signal.SIGINT)
    assert ended(one) == 0, one.seen
    assert not alive(services)
    assert not list(one.tmp.iterdir())


@pytest.mark.parametrize(
    "flag", [["--postgres"], ["--postgres-standby", "async"], ["--kafka-brokers", "3"]]
)
def test_services_flags_are_refused_outside_demo_services(
    capsys: pytest.CaptureFixture[str], flag: list[str]
) -> None:
    """A services flag with another demo: one line, exit 2, nothing started."""
    assert main(["demo", "incident", *flag]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line == f"leaseworker demo: error: {flag[0]} is for `demo services` only"


def test_sigterm_mid_run_stops_the_pods_and_services_and_removes_the_work_directory(
    demo: list[Spawned], tmp_path: Path
) -> None:
    """The stack demo with its pods running: SIGTERM ends it (130) with nothing left."""
    one = _start(demo, tmp_path)
    one.wait_for("3 pods started")
    started = one.children()
    assert len(started) >= 5  # three pods, redis-server, Kafka
    one.process.send_signal(signal.SIGTERM)
    assert ended(one) == 130, one.seen
    assert not alive(started)
    assert not list(one.tmp.iterdir())
    assert not any("kept in" in line for line in one.seen)


@pytest.mark.fake
@pytest.mark.parametrize("sigint", [signal.SIG_IGN, signal.SIG_DFL], ids=["IGN", "DFL"])
def test_a_stop_signal_interrupts_whatever_sigint_was_and_only_once(
    sigint: signal.Handlers,
) -> None:
    """SIGINT ignored (a script's background job) or left to the OS: SIGTERM interrupts, once.

    The second SIGTERM (or a SIGHUP), during the cleanup the first started, is
    ignored; an ignored SIGINT interrupts for the duration, and every handler
    is restored afterwards.
    """
    on_sigterm = signal.getsignal(signal.SIGTERM)  # the suite's own (tests/conftest.py)
    previous = signal.signal(signal.SIGINT, sigint)
    try:
        with _stop_signals_interrupt():
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGTERM)  # no second interrupt
            signal.raise_signal(signal.SIGHUP)
            if sigint is signal.SIG_IGN:
                with pytest.raises(KeyboardInterrupt):
                    signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGTERM) is on_sigterm
        assert signal.getsignal(signal.SIGINT) is sigint
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_missing_tool_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """No redis-server on PATH: ``demo services`` names what to install, no traceback."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert main(["demo", "services"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("leaseworker demo: error: redis-server is not installed")
    assert [p.name for p in tmp_path.iterdir()] == []
