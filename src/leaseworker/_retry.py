"""Retrying "not now": the named backoff policies, and :class:`Retries`, which every loop uses.

Our own 40 lines, not a library. Our loops need an injected sleep that may
say stop (a stop ends start-up waits; tests pass a fake), a per-try ``hint``
(a busy lease's TTL), retries on a result (``busy``, ``lost``) and each site's
own log line. ``stamina`` retries on exceptions, sleeps itself and is tested
by a global switch; ``tenacity.AsyncRetrying`` takes a sleep, but a stop, the
hint and the log lines would each need a ``retry_state`` adapter, for a dependency.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import final

import anyio

from ._backoff import Backoff

BUSY = Backoff()
"""Another pod holds the lease: the default ``ReportJob.busy_backoff``."""

LOST = Backoff(initial=0.5, cap=5.0)
"""A new execution after one could not confirm its lease (Redis slow or down)."""

STORE = Backoff(initial=0.2, cap=2.0)
"""A completion while the store is unavailable (the lease is held meanwhile)."""

STARTUP = Backoff(initial=0.5, cap=10.0)
"""Services away: Kafka, Redis or the store at start, a poll, a dead letter.

Its cap is the pod's ``startup_retry_cap``: see :func:`startup`.
"""


def startup(cap: float) -> Backoff:
    """Return :data:`STARTUP` capped at ``cap`` seconds (the pod's ``startup_retry_cap``)."""
    return dataclasses.replace(STARTUP, cap=cap)


Sleep = Callable[[float], Awaitable[bool | None]]
"""Wait ``seconds``; answer ``False`` to stop retrying (the pod stops), anything else to go on."""


@final
class Retries:
    """The failed tries of one operation, and the wait before the next one.

    ::

        retries = Retries(STORE)            # sleep=source.backoff: a stop ends the wait
        while True:
            try:
                return await store.complete(request)
            except StoreUnavailable as exc:
                if not await retries.wait(lambda delay, count: log(exc, delay, count)):
                    return None             # the sleep said stop
    """

    def __init__(self, policy: Backoff, *, sleep: Sleep = anyio.sleep) -> None:
        self._policy = policy
        self._sleep = sleep
        self.count = 0
        """Failed tries since the start (or the last :meth:`reset`)."""

    async def wait(
        self, log: Callable[[float, int], object] | None = None, *, hint: float | None = None
    ) -> bool:
        """Count a failed try, tell ``log`` the delay and the count, and wait it out.

        ``hint`` shortens the delay (see :meth:`Backoff.delay`). Returns
        ``False`` when the sleep answered ``False`` (stop), else ``True``.
        """
        delay = self._policy.delay(self.count, hint)
        self.count += 1
        if log is not None:
            log(delay, self.count)
        return await self._sleep(delay) is not False

    def reset(self) -> None:
        """Start counting again: the operation succeeded."""
        self.count = 0
