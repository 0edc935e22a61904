"""Commands run as processes in tests, and the processes they start (read from /proc).

Each command runs with a private ``TMPDIR``, so "no directory left" is "that
directory is empty"; its children are read from /proc by pid and start time,
so a test can check that every one of them is gone once the command exited.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Spawned:
    """A ``leaseworker`` command run as a process, whose output lines arrive on a queue."""

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
            assert line is not None, f"the command ended before {text!r}: {self.seen}"
            self.seen.append(line)
            if text in line:
                return

    def children(self) -> set[tuple[int, str]]:
        """Every process the command started and that runs now, as (pid, start time)."""
        found: set[tuple[int, str]] = set()
        parents = {self.process.pid}
        for stat in stats():
            pid, ppid, started = stat
            if ppid in parents:
                found.add((pid, started))
        self.known |= found
        return found


def stats() -> Iterator[tuple[int, int, str]]:
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


def pool_processes(pid: int) -> list[str]:
    """The command lines of ``pid``'s children that run ``leaseworker._process`` (workers, keeper).

    Not the pod's other children (the SQLite store's fsync helper).
    """
    return [
        line
        for line in child_commands(pid).values()
        if "leaseworker/_process/" in line or "_process._child" in line
    ]


def child_commands(pid: int) -> dict[int, str]:
    """The command line of each running (or unreaped) child of ``pid``, by its pid."""
    found = {}
    for child, parent, _ in stats():
        if parent == pid:
            with contextlib.suppress(OSError):  # it exited meanwhile
                found[child] = (Path("/proc") / str(child) / "cmdline").read_bytes().decode()
    return found


def alive(processes: set[tuple[int, str]]) -> set[tuple[int, str]]:
    """Return those of ``processes`` that still run (the same pid with the same start time)."""
    return processes & {(pid, started) for pid, _, started in stats()}


def stop_all(started: list[Spawned]) -> None:
    """Stop what a failing test left running.

    A command still running gets SIGTERM (its own cleanup), then SIGKILL; any
    of its children seen alive afterwards is killed by pid.
    """
    for one in started:
        if one.process.poll() is None:
            one.children()
            one.process.terminate()
            try:
                one.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                one.process.kill()
                one.process.wait()
        for pid, _ in alive(one.known):
            os.kill(pid, signal.SIGKILL)
        one.pump.join(timeout=10)
        assert one.process.stdout is not None
        one.process.stdout.close()


def start(started: list[Spawned], tmp_path: Path, *args: str, cwd: Path | None = None) -> Spawned:
    """Run ``leaseworker ARGS`` with a private TMPDIR under ``tmp_path``."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", "leaseworker._cli", *args],
        cwd=cwd,
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

    one = Spawned(process, tmp, threading.Thread(target=pump, daemon=True), lines)
    started.append(one)
    one.pump.start()
    return one


def ended(one: Spawned) -> int:
    """Wait for the command to exit (90 s at most); return its exit code."""
    code = one.process.wait(timeout=90)
    while (line := one.lines.get(timeout=10)) is not None:
        one.seen.append(line)
    return code
