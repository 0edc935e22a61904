"""Per-call timeouts for hot paths, at one loop timer per tick instead of one per call.

:class:`DeadlineWheel` files each call under a time slot that rounds down, so a
call is cut off within its timeout and never more than one tick sooner, with
``asyncio.timeout``'s cancellation protocol. See docs/design.md#deadline-wheel.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable
from typing import TypeVar, final

_T = TypeVar("_T")


@final
class DeadlineWheel:
    """Bounds awaits by ``timeout`` seconds, sharing one timer per ``timeout / resolution``.

    A wheel belongs to one event loop at a time; used on a new loop, it starts
    over (the old loop's timers went with it).
    """

    __slots__ = ("_expired", "_loop", "_slots", "_tick", "_timeout")

    def __init__(self, timeout: float, *, resolution: int = 32) -> None:
        if not timeout > 0 or resolution < 1:
            raise ValueError(f"need timeout > 0 and resolution >= 1, got {timeout}, {resolution}")
        self._timeout = timeout
        self._tick = timeout / resolution
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: dict[int, set[asyncio.Task[object]]] = {}
        self._expired: set[asyncio.Task[object]] = set()

    @property
    def tick(self) -> float:
        """How much earlier than the timeout a call may be cut off, at most."""
        return self._tick

    async def run(self, awaitable: Awaitable[_T]) -> _T:
        """Await ``awaitable``; raise :class:`TimeoutError` if it outlives the timeout."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._slots, self._expired = loop, {}, set()
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("DeadlineWheel.run must be awaited inside a task")
        slot = math.floor((loop.time() + self._timeout) / self._tick)
        waiting = self._slots.get(slot)
        if waiting is None:
            waiting = self._slots[slot] = set()
            loop.call_at(slot * self._tick, self._expire, slot, waiting)
        waiting.add(task)
        cancelling = task.cancelling()
        try:
            return await awaitable
        except asyncio.CancelledError as exc:
            if task in self._expired:
                self._expired.discard(task)
                if task.uncancel() <= cancelling:
                    raise TimeoutError from exc
            raise
        finally:
            waiting.discard(task)
            if task in self._expired:  # cut off, but the awaitable swallowed the cancel
                self._expired.discard(task)
                task.uncancel()

    def _expire(self, slot: int, waiting: set[asyncio.Task[object]]) -> None:
        """Cancel every call still ``waiting`` in ``slot`` (a loop callback)."""
        if self._slots.get(slot) is waiting:
            del self._slots[slot]
        for task in waiting:
            if not task.done():
                self._expired.add(task)
                task.cancel()
