"""One worker of a pool, seen from the pod: its child process, pipes, shared slot and keeper.

The child is started with ``subprocess.Popen`` (fork-free in spirit: CPython's
``_posixsubprocess`` execs at once, from a vfork when it can, so no state of the
threaded pod, no lock held by another thread, is carried into a running
interpreter), ``python -m leaseworker._process._child`` in a new session, so its
pid is its process group's id and one ``os.killpg`` also reaches what the job
started. Its exit is awaited on a pidfd, its status and rusage read by ``os.wait4``.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Final, NoReturn

import anyio

from .._errors import ChildProcessDied, ConfigError
from .._outcome import LeaseLostReason
from . import _frames, _slot
from ._waits import on_child

_KEEPER: Final = str(Path(__file__).with_name("_keeper.py"))


class Keeper:
    """The pool's keeper process (``_keeper.py``), told which groups to kill if the pod dies."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-S", _KEEPER],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.pid = self._process.pid

    def add(self, group: int) -> None:
        """Kill ``group`` if the pod goes away."""
        self._say(b"+%d\n" % group)

    def remove(self, group: int) -> None:
        """Forget ``group`` (reaped: its id may be reused)."""
        self._say(b"-%d\n" % group)

    def _say(self, line: bytes) -> None:
        assert self._process.stdin is not None
        if self._process.stdin.closed:  # closed: it killed every group it was told of
            return
        # A killed keeper: PDEATHSIG still covers the workers.
        with contextlib.suppress(BrokenPipeError):
            self._process.stdin.write(line)
            self._process.stdin.flush()

    def close(self, timeout: float) -> None:
        """Close its pipe (it kills what is left, none after a clean close) and reap it."""
        assert self._process.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self._process.stdin.close()
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


class CallMirror:
    """The ``Mirror`` of one call: writes the slot and wakes the child's watchdog.

    Followed from before the call waits for a free worker, so a renewal
    confirmed meanwhile is not missed: it keeps the news until :meth:`bind`
    gives it the worker's slot. Inert once its call ended, so news pushed
    late cannot reach the worker's next call.
    """

    __slots__ = ("_wake", "_writer", "active", "deadline", "lost")

    def __init__(self, deadline: float, lost: LeaseLostReason | None) -> None:
        self.deadline = deadline
        self.lost = lost
        self._writer: _slot.SlotWriter | None = None
        self._wake = -1
        self.active = True

    def bind(self, writer: _slot.SlotWriter, wake: int) -> None:
        """Write the news so far into a worker's slot; later news goes there at once."""
        self._writer, self._wake = writer, wake
        writer.write(self.deadline, self.lost)

    def move(self, deadline: float) -> None:
        """Move the child's deadline (a renewal was confirmed)."""
        if self.active:
            self.deadline = deadline
            if self._writer is not None:
                self._writer.move(deadline)
                self._poke()

    def lose(self, reason: LeaseLostReason) -> None:
        """Tell the child the lease is lost for good."""
        if self.active:
            self.lost = self.lost or reason
            if self._writer is not None:
                self._writer.lose(reason)
                self._poke()

    def _poke(self) -> None:
        # A pipe full of pokes: the watchdog will look anyway. A child already dead
        # (its pipe broken): the call's own wait reports it, never the lease's renewal.
        with contextlib.suppress(BlockingIOError, BrokenPipeError):
            os.write(self._wake, b"w")


class NotTaken(Exception):
    """A worker's child was gone before it had a whole call: the call can go to another."""


def died(pid: int, status: int | None) -> ChildProcessDied:
    """Return the error for child ``pid`` that died by itself with wait ``status`` (or unknown)."""
    if status is None:
        return ChildProcessDied(pid, signal=None, exit_code=None)
    if os.WIFSIGNALED(status):
        return ChildProcessDied(pid, signal=os.WTERMSIG(status), exit_code=None)
    return ChildProcessDied(pid, signal=None, exit_code=os.WEXITSTATUS(status))


class PoolWorker:
    """A started child and the pod's ends of its pipes and slot."""

    def __init__(self, preload: tuple[str, ...], keeper: Keeper) -> None:
        slot_fd, self._map = _slot.create()
        call_r, self._call = os.pipe()
        self._reply, reply_w = os.pipe()
        wake_r, self._wake = os.pipe()
        theirs = (call_r, reply_w, slot_fd, wake_r)
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "leaseworker._process._child", str(os.getpid())]
                + [str(fd) for fd in theirs],
                stdin=subprocess.DEVNULL,
                pass_fds=theirs,
                start_new_session=True,
            )
        finally:
            for fd in theirs:
                os.close(fd)
        self.pid = self._process.pid
        keeper.add(self.pid)
        self._keeper = keeper
        self._pidfd = os.pidfd_open(self.pid)
        for fd in (self._call, self._reply, self._wake):
            os.set_blocking(fd, False)
        self._replies = _frames.Receiver(self._reply)
        self.writer = _slot.SlotWriter(self._map)
        self.calls = 0
        self.cpu_base = 0.0
        self.ready = False
        self.reaped = False
        os.write(self._call, _frames.frame(pickle.dumps((list(sys.path), preload))))

    def follow(self, mirror: CallMirror) -> None:
        """Give ``mirror`` (the next call's) this worker's slot."""
        mirror.bind(self.writer, self._wake)

    def poll_ready(self) -> bool:
        """Whether the child said ready (without waiting); raises as ``wait_ready`` would."""
        if not self.ready:
            try:
                hello = self._replies.receive_now()
            except EOFError:
                self._raise_dead()
            if hello is not None:
                self._hello(hello)
        return self.ready

    async def wait_ready(self) -> None:
        """Wait for the child's hello; ``ConfigError`` if a preload failed."""
        if not self.ready:
            with on_child():
                hello = await self._replies.receive()
            if hello is None:
                self._raise_dead()
            else:
                self._hello(hello)

    def _hello(self, body: bytes) -> None:
        message = pickle.loads(body)
        if message[0] == "failed":
            raise ConfigError(
                f"preload module {message[1]!r} failed in a process worker: {message[2]}"
            )
        self.cpu_base = message[1]
        self.ready = True

    def _raise_dead(self) -> NoReturn:
        reaped = self.reap_now()  # exited at once, as at a failed start: its status says how
        raise died(self.pid, None if reaped is None else reaped[0])

    @property
    def waited(self) -> bool:
        """Whether the last :meth:`call` waited for the loop (else its reply was there at once)."""
        return self._replies.waited

    async def call(self, data: bytes) -> bytes | None:
        """Send one call's frame and wait for its reply (``None``: the child died meanwhile).

        ``NotTaken`` if the child was gone before it had the whole call (so it ran
        none of it): its end of the pipe closed when it exited (before its pidfd
        turned readable), so a write fails, and no system call is spent asking first.
        """
        try:
            rest = _frames.write_now(self._call, _frames.frame(data))
        except BrokenPipeError:
            raise NotTaken(self.pid) from None
        self.calls += 1
        with on_child():
            if rest:
                try:
                    await _frames.send(self._call, rest)
                except BrokenPipeError:  # it died reading the call
                    return None
            return await self._replies.receive()

    def kill(self) -> None:
        """SIGKILL the child's whole process group."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)

    def reap_now(self) -> tuple[int, resource.struct_rusage] | None:
        """Reap the child if it exited: (wait status, rusage); ``None`` while it runs."""
        if self.reaped:
            return None
        pid, status, usage = os.wait4(self.pid, os.WNOHANG)
        if not pid:
            return None
        self.reaped = True
        self._process.returncode = os.waitstatus_to_exitcode(status)
        self._keeper.remove(self.pid)
        self._close()
        return status, usage

    def gone(self) -> bool:
        """Whether the child is reaped (trying once more now, without waiting)."""
        return self.reaped or self.reap_now() is not None

    async def reap(self, within: float) -> tuple[int, resource.struct_rusage] | None:
        """Reap the child within ``within`` seconds (``None``: it did not exit in time)."""
        with on_child(), anyio.move_on_after(within):
            while True:
                reaped = self.reap_now()
                if reaped is not None or self.reaped:
                    return reaped
                await anyio.wait_readable(self._pidfd)
        return None

    def _close(self) -> None:
        self._replies.close()
        for fd in (self._call, self._reply, self._wake, self._pidfd):
            os.close(fd)
        self._map.close()
