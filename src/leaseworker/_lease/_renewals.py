"""The clock side of a held lease: when renewals run, and what a missed deadline means.

:class:`Renewals` owns everything timed about one held lease: the first
renewal's timer, the renewal task, the stop of that task, and the reading of a
missed deadline (``deadline`` or ``loop_blocked``). ``HeldLease`` owns the
body's cancel scope and the outcome; the two meet through two callbacks:
``renewed(lease, round_trip)`` and ``lose(reason, detail, at, round_trip)``.

Why asyncio's ``call_at`` and a plain task rather than an anyio task group:
the renewal task starts when the first renewal is due (a body that ends sooner
never pays for a task), and a task group's enter, exit and exit checkpoint
were measured at about a tenth of a short execution (docs/design.md, the held
lease). The task cannot fail the body anyway: any error in it is a loss, and
the body's deadline enforces a loss even if the task died. Why the stop is a
re-cancel loop: a cancellation can be swallowed on its way through a client
(redis-py's ``asyncio.wait_for`` on Python 3.11 drops one that races a reply).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import anyio

from .._errors import LeaseLost
from .._outcome import LeaseLostReason
from ._model import Lease, LeaseStore
from ._timing import LeaseTiming, now

logger = logging.getLogger("leaseworker.lease")

RECANCEL_EVERY = 0.05
"""How often a renewal task that has not stopped yet is cancelled again, in seconds."""

Renewed = Callable[[Lease, float], None]
"""Told of a confirmed renewal: the new lease and the call's round trip."""

Lose = Callable[[LeaseLostReason, str, float, "float | None"], None]
"""Told of a loss: reason, detail, when it was decided, the renewal's round trip (if one)."""


class Renewals:
    """Renew one acquired lease on schedule until it is lost or :meth:`stop` is called."""

    def __init__(
        self,
        leases: LeaseStore,
        lease: Lease,
        *,
        timing: LeaseTiming,
        release_timeout: float,
        renewed: Renewed,
        lose: Lose,
        fields: Callable[[str], dict[str, object]],
    ) -> None:
        self.lease = lease
        """The current lease: the acquired one, then each confirmed renewal's."""
        self.confirmed = 0
        """How many renewals were confirmed."""
        self.max_loop_lag = 0.0
        """The largest event-loop lag the renewal task observed, in seconds."""
        self._leases = leases
        self._timing = timing
        self._release_timeout = release_timeout
        self._renewed = renewed
        self._lose = lose
        self._fields = fields
        self._renewing: Lease | None = None  # the lease whose renewal was last sent
        self._stopping = False  # the block is ending: the renewal task must not go on
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_at(
            lease.sent_at + timing.renewal_interval, self._start
        )

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called: nothing may count as a loss any more."""
        return self._stopping

    def unconfirmed(self) -> tuple[LeaseLostReason, str]:
        """Say why the local deadline passed without a confirmed renewal.

        ``deadline`` if the renewal of the current lease was sent (Redis did not
        confirm it in time); ``loop_blocked`` if it never was: the renewal task
        could not run before the deadline, so the event loop was blocked, whether
        before the first renewal or after one, and whatever then noticed first
        (the scope's deadline, a checkpoint or the renewal task).
        """
        if self._renewing is self.lease:
            return "deadline", "no renewal was confirmed before the local deadline"
        return "loop_blocked", "the event loop was blocked: no renewal was sent before the deadline"

    async def stop(self) -> None:
        """Stop the pending first renewal or the renewal task, waiting a bounded time.

        The task also stops at its next turn once ``stopping`` is set; the
        cancellation is sent again every :data:`RECANCEL_EVERY`, and after
        ``release_timeout`` the task is abandoned (reported) rather than awaited.
        """
        self._stopping = True
        if self._timer is not None:
            self._timer.cancel()  # never started: nothing to wait for
            self._timer = None
        task = self._task
        if task is None:
            return
        give_up = now() + self._release_timeout
        with anyio.CancelScope(shield=True):
            while not task.done() and (left := give_up - now()) > 0:
                task.cancel()
                await asyncio.wait((task,), timeout=min(left, RECANCEL_EVERY))
        if not task.done():
            # Owner-checked scripts keep the abandoned call harmless: once the
            # release deleted the key, a renewal arriving later changes nothing.
            logger.warning(
                "lease renewal for %r did not stop within %.1fs of the body; abandoned",
                self.lease.key,
                self._release_timeout,
                extra=self._fields("renewal_abandoned"),
            )
            return
        if not task.cancelled() and (error := task.exception()) is not None:
            # A bug, not a lease event: the body was already bounded by its deadline.
            logger.error("lease renewal task for %r failed", self.lease.key, exc_info=error)

    def _start(self) -> None:
        """Start the renewal task (a loop callback, at the first renewal's due time).

        The callback runs in a copy of the body's context, so the task sees the
        same context variables (the trigger's trace) as the body.
        """
        self._timer = None
        self._task = asyncio.get_running_loop().create_task(
            self._renew_until_lost(), name=f"leaseworker renew {self.lease.key}"
        )

    async def _renew_until_lost(self) -> None:
        """Renew on schedule; on the first failed renewal, report the loss and end."""
        while not self._stopping:
            lease = self.lease
            due = lease.sent_at + self._timing.renewal_interval
            await anyio.sleep_until(due)
            woke = now()
            self.max_loop_lag = max(self.max_loop_lag, woke - due)
            if woke >= lease.local_deadline:
                late = f"renewal ran {(woke - due) * 1000:.0f} ms late"
                self._lose("loop_blocked", late, lease.local_deadline, None)
                return
            self._renewing = lease
            try:
                renewed = await self._leases.renew(lease)
                round_trip = now() - woke
            except LeaseLost as exc:
                verdict = now()
                self._lose(exc.reason, exc.detail, verdict, verdict - woke)
                return
            except Exception as exc:  # a custom store's bug must still stop the body
                verdict = now()
                self._lose("error", repr(exc), verdict, verdict - woke)
                return
            if self._stopping:  # the block ended meanwhile (its cancellation was swallowed)
                return
            self.lease = renewed
            self.confirmed += 1
            self._renewed(renewed, round_trip)
