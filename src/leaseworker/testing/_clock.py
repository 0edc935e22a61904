"""Virtual time for asyncio: a loop whose clock jumps to the next timer once every task waits.

Every deadline leaseworker keeps (the lease's local deadline, renewals,
``max_runtime``, per-call timeouts, retry backoff) is on the event loop's own
clock (``loop.time()``), so a loop with a virtual clock makes all of them
virtual: a 30 s lease renewed every 10 s for a 10 min job runs in milliseconds,
and every time in an assertion is exact. It is trio's
``MockClock(autojump_threshold=0)`` for asyncio.

The clock moves only when nothing is ready to run: then it jumps straight to
the next timer, except while a ``run_in_process`` child is awaited: that is
real time, and the clock keeps its pace. Code that waits on real I/O or on a thread while a timer is
pending would see that timer fire at once, so keep jobs under test on
in-memory fakes (``MemoryLeases``, ``memory://``) and run real services on a
normal loop.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Coroutine
from typing import Any, TypeVar, final

from .._process import awaiting_children

_T = TypeVar("_T")


class _JumpingSelector(selectors.DefaultSelector):
    """The loop's selector: polls real I/O, then jumps the clock instead of sleeping."""

    def __init__(self, clock: VirtualTimeLoop) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if awaiting_children():  # a child computes in real time: so does the clock, meanwhile
            begun = time.monotonic()
            ready = super().select(timeout)
            self._clock.jump(time.monotonic() - begun)
            return ready
        if timeout is None:  # no timer at all: only I/O (a thread's wake-up) can go on
            return super().select(None)
        self._clock.jump(timeout)
        return []


@final
class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio event loop on virtual time, starting at ``start`` seconds.

    ::

        with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
            runner.run(main())          # anyio.sleep(600) returns at once, at t=600.0

    ``jump(seconds)`` moves the clock forward without running anything, as a
    loop blocked by CPU work or a GC pause would see it.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        super().__init__(selector=_JumpingSelector(self))

    def time(self) -> float:
        """Return the virtual time, in seconds."""
        return self._now

    def jump(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward at once; timers due meanwhile fire late."""
        if seconds < 0:
            raise ValueError(f"time only moves forward, got {seconds}")
        self._now += seconds


def stall(seconds: float) -> None:
    """Block the running loop for ``seconds``: a jump on virtual time, a real sleep otherwise.

    What a CPU-bound step or a GC pause does to every task on the loop.
    """
    loop = asyncio.get_running_loop()
    if isinstance(loop, VirtualTimeLoop):
        loop.jump(seconds)
    else:
        time.sleep(seconds)  # the point: nothing else runs meanwhile


def run_in_virtual_time(main: Coroutine[Any, Any, _T], *, start: float = 0.0) -> _T:
    """Run ``main`` to its end on a fresh :class:`VirtualTimeLoop` and return its result."""
    with asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(start)) as runner:
        return runner.run(main)
