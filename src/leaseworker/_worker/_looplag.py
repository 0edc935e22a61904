"""Pod-wide event-loop lag: a task that sleeps a short interval and measures its oversleep.

Read from the health server's thread, which computes the lag from its own side
too, so a liveness probe can tell a stalled pod from a busy one.
See docs/design.md#health-and-loop-lag.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import final

import anyio


@dataclass(frozen=True, slots=True)
class LoopLag:
    """What the monitor knows about the event loop's lag, in seconds."""

    current: float
    """How late the loop is now: the last oversleep, or the ongoing one if larger."""
    max: float
    """The largest lag seen since the monitor started."""
    stalls: int
    """How many times a measured lag exceeded the stall threshold."""


@final
class LoopLagMonitor:
    """Measure how late the event loop wakes a sleeping task, every ``interval`` seconds.

    ::

        monitor = LoopLagMonitor(interval=0.25, stall_threshold=10)
        tg.start_soon(monitor.run)
        lag = monitor.read()            # from any thread

    ``stall_threshold`` only counts stalls (:attr:`LoopLag.stalls`); whether a
    lag makes the pod unhealthy is the health endpoint's decision.
    """

    def __init__(self, *, interval: float = 0.25, stall_threshold: float = 10.0) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval}")
        self._interval = interval
        self._threshold = stall_threshold
        self._woke = time.monotonic()
        self._last = 0.0
        self._max = 0.0
        self._stalls = 0

    async def run(self) -> None:
        """Measure until cancelled."""
        while True:
            self._woke = time.monotonic()
            await anyio.sleep(self._interval)
            self._record(time.monotonic() - self._woke - self._interval)

    def _record(self, lag: float) -> None:
        lag = max(0.0, lag)
        if lag > self._threshold:
            self._stalls += 1
        self._max = max(self._max, lag)
        self._last = lag

    def read(self, now: float | None = None) -> LoopLag:
        """Return the lag as seen now (safe to call from any thread)."""
        now = time.monotonic() if now is None else now
        ongoing = max(0.0, now - self._woke - self._interval)
        current = max(self._last, ongoing)
        return LoopLag(current=current, max=max(self._max, current), stalls=self._stalls)
