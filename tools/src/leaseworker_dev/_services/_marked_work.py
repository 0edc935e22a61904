"""CPU-bound work that leaves marks, and the kernel's word on when a process exited.

The incident demo, the fault campaign and the tests prove that no code of an
execution ran after it stopped, child processes included. Their job runs
:func:`crunch`: a pure-Python loop that never awaits and never checks its
lease, appending ``<pid> <time.monotonic()>`` to a marks file about every
millisecond (and, asked to, starting a grandchild process that marks the
same file, as a job's own subprocess would). Linux's monotonic clock is one
clock for every process on the machine, so those marks compare directly with
the pods' recorded histories. A mark is taken before it is written, so the
last mark of a process is at most one interval before its last instruction.

:class:`ExitWatch` learns when a process exited from the kernel: a pidfd per
process, which becomes readable when the process ends; one thread polls them
all and notes the monotonic time it woke, an upper bound of the exit that no
log line of the dying process can give.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

MARK_EVERY = 0.001
"""Seconds between two marks of :func:`crunch`."""

MARKS_VARIABLE = "LEASEWORKER_MARKS_DIR"
"""Where a job writes its executions' marks (:func:`marks_file`); the campaign sets it."""

GRANDCHILD = """\
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
pid = os.getpid()
while True:
    os.write(fd, f"{pid} {time.monotonic():.6f}\\n".encode())
    time.sleep(0.002)
"""
"""The grandchild's program: mark ``argv[1]`` every 2 ms until killed."""


def crunch(_ctx: object, seconds: float, marks: str, grandchild: bool = False) -> int:
    """Compute for ``seconds`` without ever yielding, marking ``marks``; return a checksum.

    ``_ctx`` is the ``ProcessContext`` when run through ``run_in_process`` (the
    loop never looks at it: this is code that does not cooperate); ``None``
    when run in the event loop. ``grandchild``: also start a process that
    marks the file until this call ends (it is stopped before returning).
    """
    descriptor = os.open(marks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    helper = None
    try:
        if grandchild:
            helper = subprocess.Popen([sys.executable, "-c", GRANDCHILD, marks])
        pid = os.getpid()
        value, last = 1, 0.0
        end = time.monotonic() + seconds
        while (now := time.monotonic()) < end:
            for _ in range(500):
                value = (value * 1_103_515_245 + 12_345) & 0xFFFF_FFFF
            if now - last >= MARK_EVERY:
                os.write(descriptor, f"{pid} {now:.6f}\n".encode())
                last = now
        return value
    finally:
        if helper is not None:
            helper.kill()
            helper.wait()
        os.close(descriptor)


def marks_file(execution_id: str) -> str:
    """Return the marks file of one execution, under ``$LEASEWORKER_MARKS_DIR`` (else /dev/null)."""
    directory = os.environ.get(MARKS_VARIABLE)
    if not directory:
        return os.devnull
    Path(directory).mkdir(parents=True, exist_ok=True)
    return str(Path(directory) / execution_id)


def read_marks(path: Path) -> dict[int, list[float]]:
    """Return the marks of ``path`` by pid, in order (none when it does not exist)."""
    found: dict[int, list[float]] = {}
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:  # a line cut short by a kill mid-write is dropped
                found.setdefault(int(parts[0]), []).append(float(parts[1]))
    return found


class ExitWatch:
    """Note when watched processes exit, on the monotonic clock, as the kernel reports it.

    ``with ExitWatch() as watch: watch.add(pid) ... watch.exited(pid)``. The
    processes need not be this process's children.
    """

    def __init__(self) -> None:
        self._poll = select.epoll()
        self._wake_r, self._wake_w = os.pipe()
        self._poll.register(self._wake_r, select.EPOLLIN)
        self._pids: dict[int, int] = {}  # pidfd -> pid
        self._exits: dict[int, float] = {}
        self._changed = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._watch, name="exit-watch", daemon=True)
        self._thread.start()

    def __enter__(self) -> ExitWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, pid: int) -> bool:
        """Watch ``pid``; return ``False`` if it had already exited (no time known then)."""
        try:
            descriptor = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        with self._changed:
            self._pids[descriptor] = pid
        self._poll.register(descriptor, select.EPOLLIN)
        return True

    def exited(self, pid: int, *, within: float = 0.0) -> float | None:
        """Return when ``pid`` exited (monotonic), waiting up to ``within`` s; ``None``: not yet."""
        deadline = time.monotonic() + within
        with self._changed:
            while pid not in self._exits and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(left)
            return self._exits.get(pid)

    def close(self) -> None:
        """Stop the thread and close every pidfd."""
        if self._closed:
            return
        self._closed = True
        os.write(self._wake_w, b"x")
        self._thread.join()
        for descriptor in list(self._pids):
            os.close(descriptor)
        for descriptor in (self._wake_r, self._wake_w):
            os.close(descriptor)
        self._poll.close()

    def _watch(self) -> None:
        while True:
            for descriptor, _ in self._poll.poll():
                at = time.monotonic()
                if descriptor == self._wake_r:
                    return
                self._poll.unregister(descriptor)
                with self._changed:
                    self._exits[self._pids[descriptor]] = at
                    self._changed.notify_all()
