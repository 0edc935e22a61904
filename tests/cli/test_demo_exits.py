"""``leaseworker demo`` leaves nothing behind: no process, no directory, whatever stops it.

Each demo here runs with a private ``TMPDIR``, so "no directory left" is
"that directory is empty"; the processes it started are read from /proc
(children of the demo, by pid and start time) before the signal and must all
be gone once it exited. ``demo services`` (the stack alone, about 5 s) takes
each of SIGTERM, SIGHUP and SIGINT while it waits; the full stack demo takes a
SIGTERM mid-run, with its three pods up.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from leaseworker._cli._demo import _stop_signals_interrupt
from leaseworker._cli._main import main


@dataclass
class Demo:
    """A ``leaseworker demo`` process whose output lines arrive on a queue."""

    process: subprocess.Popen[str]
    tmp: Path
    pump: threading.Thread
    lines: queue.Queue[str | None] = field(default_factory=queue.Queue)
    seen: list[str] = field(default_factory=list)
    known: set[tuple[int, str]] = field(default_factory=set)  # every child ever seen

    def wait_for(self, text: str, *, within: float = 90.0) -> None:
        """Block until a line containing ``text`` was printed (fail if the demo ends first)."""
        while True:
            line = self.lines.get(timeout=within)
            assert line is not None, f"demo ended before {text!r}: {self.seen}"
            self.seen.append(line)
            if text in line:
                return

    def children(self) -> set[tuple[int, str]]:
        """Every process the demo started and that runs now, as (pid, start time)."""
        found: set[tuple[int, str]] = set()
        parents = {self.process.pid}
        for stat in _stats():
            pid, ppid, started = stat
            if ppid in parents:
                found.add((pid, started))
        self.known |= found
        return found


def _stats() -> Iterator[tuple[int, int, str]]:
    """Yield (pid, parent pid, start time in clock ticks) of every process."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:  # it exited meanwhile
            continue
        fields = text.rsplit(")", 1)[1].split()  # the name may contain spaces
        yield int(entry.name), int(fields[1]), fields[19]


def _alive(processes: set[tuple[int, str]]) -> set[tuple[int, str]]:
    return processes & {(pid, started) for pid, _, started in _stats()}


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[list[Demo]]:
    """Start demos with a private TMPDIR; stop what a failing test left running.

    A demo still running gets SIGTERM (its own cleanup), then SIGKILL; any of
    its children seen alive afterwards is killed by pid.
    """
    started: list[Demo] = []
    yield started
    for one in started:
        if one.process.poll() is None:
            one.children()
            one.process.terminate()
            try:
                one.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                one.process.kill()
                one.process.wait()
        for pid, _ in _alive(one.known):
            os.kill(pid, signal.SIGKILL)
        one.pump.join(timeout=10)
        assert one.process.stdout is not None
        one.process.stdout.close()


def _start(started: list[Demo], tmp_path: Path, *args: str) -> Demo:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", "leaseworker._cli", "demo", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    one = Demo(process, tmp, threading.Thread(target=pump, daemon=True), lines)
    started.append(one)
    one.pump.start()
    return one


def _ended(one: Demo) -> int:
    code = one.process.wait(timeout=90)
    while (line := one.lines.get(timeout=10)) is not None:
        one.seen.append(line)
    return code


@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=["TERM", "HUP", "INT"]
)
def test_each_stop_signal_stops_the_services_and_removes_their_directories(
    demo: list[Demo], tmp_path: Path, signum: signal.Signals
) -> None:
    """``demo services`` up (Redis, Kafka, maybe Jaeger): the signal leaves nothing behind."""
    one = _start(demo, tmp_path, "services")
    one.wait_for("press Ctrl-C")
    services = one.children()
    assert len(services) >= 2  # redis-server and Kafka's JVM at least
    assert any(one.tmp.iterdir())
    one.process.send_signal(signum)
    assert _ended(one) == 0, one.seen
    assert "stopping the services" in one.seen
    assert not _alive(services)
    assert not list(one.tmp.iterdir())


def test_sigterm_mid_run_stops_the_pods_and_services_and_removes_the_work_directory(
    demo: list[Demo], tmp_path: Path
) -> None:
    """The stack demo with its pods running: SIGTERM ends it (130) with nothing left."""
    one = _start(demo, tmp_path)
    one.wait_for("3 pods started")
    started = one.children()
    assert len(started) >= 5  # three pods, redis-server, Kafka
    one.process.send_signal(signal.SIGTERM)
    assert _ended(one) == 130, one.seen
    assert not _alive(started)
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
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
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
