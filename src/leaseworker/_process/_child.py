"""A pool worker's child process: ``python -m leaseworker._process._child PPID IN OUT SLOT WAKE``.

It runs in its own session (its process group is the one the pod kills), dies
with the thread of its pod that started it (``PR_SET_PDEATHSIG``), imports the
pool's preload modules once, then runs one call per frame read from ``IN``,
answering on ``OUT``, until ``IN`` closes.

Fail closed: while a call runs, a watchdog thread sleeps to the deadline in the
shared ``SLOT`` (woken through ``WAKE`` when the pod moves it) and then kills the
whole group; a kernel timer (``ITIMER_REAL``, SIGALRM left at its default action)
kills the child itself 25 ms later if that thread could not run (a C
extension holding the GIL, or the machine's load; the keeper then kills the job's
own processes, seeing the child gone). The thread re-arms the timer when the deadline moves,
so a child that holds the GIL past a renewal dies at the deadline it had, and
disarms it when the child is idle near its deadline.
"""

from __future__ import annotations

import ctypes
import importlib
import math
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
from collections.abc import Callable
from typing import Final

from ._context import ProcessContext
from ._frames import BlockingReader, reply_head, write_blocking, write_reply
from ._slot import SIZE, read

_PR_SET_PDEATHSIG: Final = 1
# The kernel timer fires this long after the deadline: five GIL switch intervals, time for the
# watchdog thread to take the GIL from a job computing in Python and kill the whole group first.
_KERNEL_SLACK: Final = 0.025
_PAGE: Final = os.sysconf("SC_PAGE_SIZE")
_EARLY: Final = 0.001  # select() may wake this much before the deadline: that is the deadline
# The thread disarms an idle child's kernel timer this long before the deadline it is armed for.
_IDLE_LEAD: Final = 0.1
_MOST_FUNCTIONS: Final = 1024
# After a call that took no page fault, the peak is reset again only once this long passed.
_FRESH: Final = 0.010


def main(argv: list[str]) -> int:
    """Serve calls until the pod closes the pipe; 1 if a preload failed."""
    ppid, fd_in, fd_out, fd_slot, fd_wake = (int(arg) for arg in argv)
    _die_with_parent(ppid)
    for fd in (fd_in, fd_out, fd_slot, fd_wake):
        os.set_inheritable(fd, False)  # the job's own subprocesses get none of them
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a segfaulting job leaves no core file
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    slot = mmap.mmap(fd_slot, SIZE)
    calls = BlockingReader(fd_in)
    hello = calls.read()
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
    memory = Memory()
    spent, faults = _usage()
    memory.reset(faults)
    write_blocking(fd_out, pickle.dumps(("ready", spent)))
    recent = Recent(slot)
    while (body := calls.read()) is not None:
        head, payload, spent, faults = _call(body, recent, watchdog, memory, spent)
        del body
        write_reply(fd_out, head, payload)
        del payload  # neither the call's bytes nor its reply's count in the next call's peak
        memory.reset(faults)  # for the next call, while the pod reads this one's reply
    return 0


def _die_with_parent(ppid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != ppid:  # the pod died before the line above
        os._exit(1)


def _call(
    body: bytes, recent: Recent, watchdog: Watchdog, memory: Memory, before: float
) -> tuple[bytes, bytes, float, int]:
    """Run one call; return its reply's head and pickle, the child's CPU total and page faults.

    ``before``: the total at the previous reply, so a call's CPU includes the
    child's work for it (reading and unpickling it, pickling its result), as a
    killed call's does. Both totals are taken after the result's pickle: its
    pages are the call's, and no page is taken between them and the reset.
    """
    watchdog.begin()
    try:
        identity, fn, args, kwargs = pickle.loads(body)
        if type(fn) is bytes:
            fn = recent.function(fn)
        reply: tuple[object, ...] = ("returned", fn(recent.context(identity), *args, **kwargs))
    except BaseException as exc:
        watchdog.end()
        reply = _raised(exc)
    else:
        watchdog.end()
    try:
        payload = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        problem = TypeError(f"the function's result cannot be pickled: {_one_line(exc)}")
        payload = pickle.dumps(_raised(problem))
    del reply
    after, faults = _usage()
    # The cost ahead of the payload, so it crosses even when the pod cannot rebuild the payload.
    head = reply_head(after - before, memory.peak(faults), after, len(payload))
    return head, payload, after, faults


class Recent:
    """What calls in a row share: their execution's ``ProcessContext``, their functions.

    A plain function comes as its pickle (a reference the pod made once); the
    function rebuilt from it is kept by those bytes, at most ``_MOST_FUNCTIONS``.
    """

    __slots__ = ("_functions", "_identity", "_pctx", "_slot")

    def __init__(self, slot: mmap.mmap) -> None:
        self._slot = slot
        self._identity: tuple[str, str, int] | None = None
        self._pctx: ProcessContext | None = None
        self._functions: dict[bytes, Callable[..., object]] = {}

    def context(self, identity: tuple[str, str, int]) -> ProcessContext:
        """Return the context of the execution ``identity`` (job key, execution id, fence)."""
        if identity != self._identity or self._pctx is None:
            job_key, execution_id, fence = identity
            self._pctx = ProcessContext(
                self._slot, job_key=job_key, execution_id=execution_id, fence=fence
            )
            self._identity = identity
        return self._pctx

    def function(self, reference: bytes) -> Callable[..., object]:
        """Return the function a reference's pickle names (imported on first use)."""
        fn = self._functions.get(reference)
        if fn is None:
            fn = pickle.loads(reference)
            if len(self._functions) >= _MOST_FUNCTIONS:
                self._functions.clear()
            self._functions[reference] = fn
        return fn


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


def _usage() -> tuple[float, int]:
    """Return the CPU seconds of the child and its waited children, and its page faults."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    waited = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime + waited.ru_utime + waited.ru_stime
    return cpu, me.ru_minflt + me.ru_majflt


class Memory:
    """A call's peak resident set: ``VmHWM``, reset between calls.

    The reset writes ``5`` to ``/proc/self/clear_refs`` (VmHWM back to the
    current RSS) and reads that RSS from ``/proc/self/statm``. The resident
    set grows by this process's page faults, which ``getrusage`` counts
    (``MAP_POPULATE`` and ``mlock`` included): a call that took none since the
    count given to :meth:`reset` did not raise VmHWM, and its peak is that
    RSS. Pages that come without a fault of ours (khugepaged filling a huge
    page, 2 MiB; another process writing into this one) are the corner this
    misses. A call that faulted reads VmHWM from ``/proc/self/status``, whose
    every read formats some forty lines (about 8 µs). The files stay open (an
    open costs as much again). Not ``ru_maxrss``: it keeps the peak of the
    address space the child was exec'd from, which is the pod's own when
    Popen spawns through vfork. Without ``/proc`` the peak is the child's
    lifetime one.

    The reset (the two files: 7-10 µs of a no-op call's 30 in the child, on
    the loaded machine of 6 December) is skipped after a call when no page
    fault came since the last one and that one is under ``_FRESH`` (10 ms)
    old: neither VmHWM nor the RSS can have risen. Memory given back since
    without a fault (a call that only drops a cache) then stays in the
    figure, high, never low, until the first call that ends 10 ms after the
    last reset resets it.
    """

    def __init__(self) -> None:
        self._status = _open("/proc/self/status", os.O_RDONLY)
        self._statm = _open("/proc/self/statm", os.O_RDONLY)
        self._clear = _open("/proc/self/clear_refs", os.O_WRONLY)
        self._faults = -1  # the count at the last reset; -1: no resident set known
        self._resident = 0
        self._reset_at = -math.inf

    def reset(self, faults: int) -> None:
        """Start a new peak at the current resident set; ``faults``: the count now."""
        now = time.monotonic()
        if faults == self._faults and now - self._reset_at < _FRESH:
            return
        self._faults = -1
        if self._clear is not None and self._statm is not None:
            try:
                os.write(self._clear, b"5")
                pages = int(os.pread(self._statm, 128, 0).split()[1])
            except (OSError, ValueError, IndexError):
                return
            self._faults, self._resident, self._reset_at = faults, pages * _PAGE, now

    def peak(self, faults: int) -> int:
        """Return the peak resident set in bytes since the last :meth:`reset`.

        ``faults``: the page faults so far, as :func:`_usage` counts them.
        """
        if faults == self._faults:
            return self._resident
        if self._status is not None:
            try:
                status = os.pread(self._status, 8192, 0)
                at = status.index(b"VmHWM:") + 6
                return int(status[at : status.index(b"kB", at)]) * 1024
            except (OSError, ValueError):
                pass
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _open(path: str, flags: int) -> int | None:
    try:
        return os.open(path, flags)  # not inheritable: the job's subprocesses get neither
    except OSError:
        return None


class Watchdog:
    """Kills the child's group at the deadline in the slot while a call runs.

    A thread waits on the pod's wake pipe (the deadline moved) and on its own
    with a timeout; at the deadline it kills the group (``os.killpg(0,
    SIGKILL)``). The kernel timer is the backstop for when this thread cannot
    get the GIL: armed to the deadline plus ``_KERNEL_SLACK``, and re-armed,
    by a call that begins or by the thread, only when the slot's deadline is
    more than ``_EARLY`` from the one it is armed for (calls in a row under one
    lease make no system call for it: each costs a no-op call a few
    microseconds). It stays armed when a call ends, and the thread disarms it
    once the child is idle ``_IDLE_LEAD`` before that deadline (or at the
    deadline, for a call that ended closer to it than that). An idle child dies
    by it only if the thread is kept from running for ``_KERNEL_SLACK`` right
    then; the pool replaces a worker that died idle, and gives the call to another.

    A call that begins wakes the thread only when it would look too late (idle
    with the timer disarmed, or sleeping past the call's deadline by more than
    ``_EARLY``): waking it costs the call a GIL hand-over. While a call runs the
    thread looks ``_IDLE_LEAD`` before the deadline and at it.
    """

    def __init__(self, slot: mmap.mmap, wake: int) -> None:
        self._slot = slot
        self._wake = wake
        self._lock = threading.Lock()
        self._active = False
        self._until: float | None = None  # when the thread looks again by itself (None: never)
        self._armed: float | None = None  # the deadline the kernel timer is armed for
        self._poke_r, self._poke_w = os.pipe()
        thread = threading.Thread(target=self._watch, name="leaseworker-watchdog", daemon=True)
        thread.start()

    def begin(self) -> None:
        """Arm the timer to the slot's deadline, wake the thread if it would look too late."""
        with self._lock:
            self._active = True
            deadline = self._rearm()
            # Within _EARLY is on time: a deadline converted from another clock (hold()'s)
            # differs by microseconds from one call to the next.
            late = self._until is None or self._until > deadline + _EARLY
        if late:
            os.write(self._poke_w, b"b")

    def end(self) -> None:
        """Stop killing at the deadline: the call ended (the kernel timer stays armed).

        No lock: a thread that saw the call still running kills at the deadline,
        as it would have if this came a moment later.
        """
        self._active = False

    def _rearm(self) -> float:
        """Kill the group if the slot's deadline passed, else arm the timer to it if it moved."""
        deadline, _, _ = read(self._slot)
        left = deadline - time.monotonic()
        if left <= _EARLY:
            os.killpg(0, signal.SIGKILL)
        armed = self._armed
        if armed is None or abs(deadline - armed) > _EARLY:
            signal.setitimer(signal.ITIMER_REAL, left + _KERNEL_SLACK)
            self._armed = deadline
        return deadline

    def _watch(self) -> None:
        timeout: float | None = None
        while True:
            ready, _, _ = select.select([self._wake, self._poke_r], [], [], timeout)
            for fd in ready:
                os.read(fd, 4096)
            with self._lock:
                now = time.monotonic()
                if self._active:
                    deadline = self._rearm()
                    until: float | None = deadline
                    if deadline - now > _IDLE_LEAD + _EARLY:
                        until = deadline - _IDLE_LEAD  # to disarm if the call ended by then
                elif self._armed is not None and self._armed - _IDLE_LEAD > now + _EARLY:
                    until = self._armed - _IDLE_LEAD  # idle: the next call may share the deadline
                else:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                    self._armed = until = None
                self._until = until
                timeout = None if until is None else max(0.0, until - now)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
