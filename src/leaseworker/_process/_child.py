"""A pool worker's child process: ``python -m leaseworker._process._child PPID IN OUT SLOT WAKE``.

It runs in its own session (its process group is the one the pod kills), dies
with the thread of its pod that started it (``PR_SET_PDEATHSIG``), imports the
pool's preload modules once, then runs one call per frame read from ``IN``,
answering on ``OUT``, until ``IN`` closes.

Fail closed: while a call runs, a watchdog thread sleeps to the deadline in the
shared ``SLOT`` (woken through ``WAKE`` when the pod moves it) and then kills the
whole group; a kernel timer (``ITIMER_REAL``, SIGALRM left at its default action)
kills the child itself 25 ms later if that thread could not run (a C
extension holding the GIL; the job's own processes then live until the pod or the
keeper kills the group). The thread re-arms the timer when the deadline moves,
so a child that holds the GIL past a renewal dies at the deadline it had.
"""

from __future__ import annotations

import ctypes
import importlib
import mmap
import os
import pickle
import resource
import select
import signal
import sys
import threading
import time
import traceback
from typing import Final

from ._context import ProcessContext
from ._frames import read_blocking, write_blocking
from ._slot import SIZE, read

_PR_SET_PDEATHSIG: Final = 1
# The kernel timer fires this long after the deadline: five GIL switch intervals, time for the
# watchdog thread to take the GIL from a job computing in Python and kill the whole group first.
_KERNEL_SLACK: Final = 0.025
_EARLY: Final = 0.001  # select() may wake this much before the deadline: that is the deadline


def main(argv: list[str]) -> int:
    """Serve calls until the pod closes the pipe; 1 if a preload failed."""
    ppid, fd_in, fd_out, fd_slot, fd_wake = (int(arg) for arg in argv)
    _die_with_parent(ppid)
    for fd in (fd_in, fd_out, fd_slot, fd_wake):
        os.set_inheritable(fd, False)  # the job's own subprocesses get none of them
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a segfaulting job leaves no core file
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    slot = mmap.mmap(fd_slot, SIZE)
    hello = read_blocking(fd_in)
    if hello is None:
        return 0
    path, preload = pickle.loads(hello)
    sys.path[:] = path
    for name in preload:
        try:
            importlib.import_module(name)
        except BaseException as exc:
            write_blocking(fd_out, pickle.dumps(("failed", name, _one_line(exc))))
            return 1
    watchdog = Watchdog(slot, fd_wake)
    _reset_peak()
    write_blocking(fd_out, pickle.dumps(("ready", _cpu())))
    while (body := read_blocking(fd_in)) is not None:
        write_blocking(fd_out, _call(body, slot, watchdog))
        _reset_peak()  # for the next call, while the pod reads this one's reply
    return 0


def _die_with_parent(ppid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != ppid:  # the pod died before the line above
        os._exit(1)


def _call(body: bytes, slot: mmap.mmap, watchdog: Watchdog) -> bytes:
    before = _cpu()
    watchdog.begin()
    try:
        (job_key, execution_id, fence), fn, args, kwargs = pickle.loads(body)
        pctx = ProcessContext(slot, job_key=job_key, execution_id=execution_id, fence=fence)
        reply: tuple[object, ...] = ("returned", fn(pctx, *args, **kwargs))
    except BaseException as exc:
        watchdog.end()
        reply = _raised(exc)
    else:
        watchdog.end()
    after = _cpu()
    cost = (after - before, _peak(), after)
    try:
        payload = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        problem = TypeError(f"the function's result cannot be pickled: {_one_line(exc)}")
        payload = pickle.dumps(_raised(problem))
    # Pickled apart, so the cost crosses even when the pod cannot rebuild the payload.
    return pickle.dumps((cost, payload), protocol=pickle.HIGHEST_PROTOCOL)


def _raised(exc: BaseException) -> tuple[object, ...]:
    text = "".join(traceback.format_exception(exc))
    name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)  # one that cannot be rebuilt goes as its type and message
    except Exception:
        return ("raised", None, name, str(exc), text)
    return ("raised", data, name, str(exc), text)


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def _cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    waited = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + waited.ru_utime + waited.ru_stime


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass  # then the peak read after the call is the child's lifetime peak


def _peak() -> int:
    """Return VmHWM in bytes: the peak RSS since the last reset (one read, no line loop).

    Not ``ru_maxrss``: it keeps the peak of the address space the child was
    exec'd from, which is the pod's own when Popen spawns through vfork.
    """
    try:
        fd = os.open("/proc/self/status", os.O_RDONLY)
        try:
            status = os.read(fd, 8192)
        finally:
            os.close(fd)
        at = status.index(b"VmHWM:") + 6
        return int(status[at : status.index(b"kB", at)]) * 1024
    except (OSError, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Watchdog:
    """Kills the child's group at the deadline in the slot while a call runs.

    A thread waits on the pod's wake pipe (the deadline moved) and on its own
    (a call began) with a timeout to the deadline; at the deadline it
    kills the group (``os.killpg(0, SIGKILL)``). Each time it looks, it re-arms the
    kernel timer, the backstop for when this thread cannot get the GIL.
    """

    def __init__(self, slot: mmap.mmap, wake: int) -> None:
        self._slot = slot
        self._wake = wake
        self._lock = threading.Lock()
        self._active = False
        self._poke_r, self._poke_w = os.pipe()
        thread = threading.Thread(target=self._watch, name="leaseworker-watchdog", daemon=True)
        thread.start()

    def begin(self) -> None:
        """Arm the timer to the slot's deadline and wake the thread: a call starts."""
        with self._lock:
            self._active = True
            self._arm()
        os.write(self._poke_w, b"b")

    def end(self) -> None:
        """Disarm: the call ended (before its reply is sent, so a late kill cannot race it)."""
        with self._lock:
            self._active = False
            signal.setitimer(signal.ITIMER_REAL, 0)
        # No wake-up: the thread finds the call over when its timeout comes, and sleeps on.

    def _arm(self) -> float:
        deadline, _, _ = read(self._slot)
        left = deadline - time.monotonic()
        if left <= _EARLY:
            os.killpg(0, signal.SIGKILL)
        signal.setitimer(signal.ITIMER_REAL, left + _KERNEL_SLACK)
        return left

    def _watch(self) -> None:
        timeout: float | None = None
        while True:
            ready, _, _ = select.select([self._wake, self._poke_r], [], [], timeout)
            for fd in ready:
                os.read(fd, 4096)
            with self._lock:
                timeout = self._arm() if self._active else None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
