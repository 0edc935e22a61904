"""The clock side of held leases: one shared tick renews every lease that falls due.

:class:`Renewals` is one held lease's side of it: the current lease, the
renewals confirmed, and the reading of a missed deadline (``deadline`` or
``loop_blocked``). ``HeldLease`` owns the body's cancel scope and the outcome;
the two meet through two callbacks: ``renewed(lease, round_trip)`` and
``lose(reason, detail, at, round_trip)``.

:class:`RenewalClock` (one per event loop) files every held lease under the
time slot its next renewal falls due in (slots of ``renewal_interval / 16``,
at most :data:`EARLY`), with one loop timer per slot at its earliest due time;
when it fires, every lease of the slot is renewed at once, none late and none
more than a slot early. A store with ``renew_many(leases)`` (``RedisLeases``)
gets them as one batch: one task, one trip. Any other store gets one task per
renewal, in the body's context. Each lease keeps its own deadline (the body's
scope) and its own verdict: a renewal that fails, is rejected or comes back
late cancels its body alone, as ``HeldLease`` guarantees.

Why no task per held lease: 10,000 held leases were 10,000 sleeping tasks and
timers, and ending one cost a cancellation and an awaited stop. A stop now
takes the lease out of its slot; a renewal in flight is ignored when it
answers (the scripts check the owner: one arriving after the release changes
nothing).
"""

from __future__ import annotations

import asyncio
import contextvars
import math
from collections.abc import Awaitable, Callable, Sequence

from .._errors import LeaseLost
from .._outcome import LeaseLostReason
from ._model import Lease, LeaseStore
from ._per_loop import PerLoop
from ._timing import LeaseTiming, now

EARLY = 0.05
"""The widest slot, in seconds: how much sooner than due a renewal may go with others."""

Renewed = Callable[[Lease, float], None]
"""Told of a confirmed renewal: the new lease and the call's round trip."""

Lose = Callable[[LeaseLostReason, str, float, "float | None"], None]
"""Told of a loss: reason, detail, when it was decided, the renewal's round trip (if one)."""

RenewMany = Callable[[Sequence[Lease]], Awaitable[Sequence["Lease | BaseException"]]]
"""A store's optional ``renew_many(leases)``: one verdict per lease, a ``LeaseLost`` for a loss."""


class Renewals:
    """Renew one acquired lease on schedule until it is lost or :meth:`stop` is called."""

    __slots__ = (
        "_context",
        "_leases",
        "_lose",
        "_renewed",
        "_renewing",
        "_slot",
        "_stopping",
        "_task",
        "_timing",
        "confirmed",
        "lease",
        "max_loop_lag",
        "width",
    )

    def __init__(
        self,
        leases: LeaseStore,
        lease: Lease,
        *,
        timing: LeaseTiming,
        renewed: Renewed,
        lose: Lose,
    ) -> None:
        self.lease = lease
        """The current lease: the acquired one, then each confirmed renewal's."""
        self.confirmed = 0
        """How many renewals were confirmed."""
        self.max_loop_lag = 0.0
        """The largest lag behind its due time a renewal of this lease went with, in seconds."""
        self.width = min(EARLY, timing.renewal_interval / 16)
        """This lease's slot width: how much sooner than due its renewal may go."""
        self._leases = leases
        self._timing = timing
        self._renewed = renewed
        self._lose = lose
        self._renewing: Lease | None = None  # the lease whose renewal was last sent
        self._stopping = False  # the block is ending: nothing may count any more
        self._slot: dict[Renewals, float] | None = None  # where the clock filed it
        self._task: asyncio.Task[None] | None = None  # a renewal alone, in flight
        # A store without renew_many renews in a task of its own, in the body's context.
        self._context = None if hasattr(leases, "renew_many") else contextvars.copy_context()
        clock().file(self, lease.sent_at + timing.renewal_interval)

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called: nothing may count as a loss any more."""
        return self._stopping

    def unconfirmed(self) -> tuple[LeaseLostReason, str]:
        """Say why the local deadline passed without a confirmed renewal.

        ``deadline`` if the renewal of the current lease was sent (Redis did not
        confirm it in time); ``loop_blocked`` if it never was: the clock could
        not run before the deadline, so the event loop was blocked, whether
        before the first renewal or after one, and whatever then noticed first
        (the scope's deadline, a checkpoint or the clock).
        """
        if self._renewing is self.lease:
            return "deadline", "no renewal was confirmed before the local deadline"
        return "loop_blocked", "the event loop was blocked: no renewal was sent before the deadline"

    def stop(self) -> None:
        """Stop renewing: out of the clock's slot; a renewal in flight is ignored (or cancelled)."""
        self._stopping = True
        if self._slot is not None:
            del self._slot[self]
            self._slot = None
        if self._task is not None:
            self._task.cancel()  # not awaited: its answer, if any, changes nothing now
            self._task = None

    def _due(self, woke: float, due: float) -> bool:
        """Take the clock's call: whether to renew now (``False``: lost, the loop was blocked)."""
        self._slot = None
        self.max_loop_lag = max(self.max_loop_lag, woke - due)
        if woke >= self.lease.local_deadline:
            late = f"renewal ran {(woke - due) * 1000:.0f} ms late"
            self._lose("loop_blocked", late, self.lease.local_deadline, None)
            return False
        self._renewing = self.lease
        return True

    def _alone(self, woke: float) -> None:
        """Renew in a task of its own (a store without ``renew_many``)."""
        assert self._context is not None
        self._task = asyncio.get_running_loop().create_task(
            self._renew(woke), name=f"leaseworker renew {self.lease.key}", context=self._context
        )

    async def _renew(self, woke: float) -> None:
        try:
            renewed: Lease | BaseException = await self._leases.renew(self.lease)
        except Exception as exc:  # a custom store's bug must still stop the body
            renewed = exc
        self._task = None
        self._answered(renewed, woke)

    def _answered(self, renewed: Lease | BaseException, woke: float) -> None:
        """Take a renewal's verdict: file the next one, or report the loss."""
        if self._stopping:  # the block ended meanwhile
            return
        verdict = now()
        if isinstance(renewed, LeaseLost):
            self._lose(renewed.reason, renewed.detail, verdict, verdict - woke)
        elif isinstance(renewed, BaseException):
            self._lose("error", repr(renewed), verdict, verdict - woke)
        else:
            self.lease = renewed
            self.confirmed += 1
            self._renewed(renewed, verdict - woke)
            if not self._stopping:  # a hook may have ended the block
                clock().file(self, renewed.sent_at + self._timing.renewal_interval)


class RenewalClock:
    """The due renewals of every held lease on one event loop; see the module docstring."""

    __slots__ = ("__weakref__", "_armed", "_slots", "_tasks")

    def __init__(self) -> None:
        self._slots: dict[tuple[float, int], dict[Renewals, float]] = {}
        self._armed: dict[tuple[float, int], float] = {}  # each slot's timer: when it fires
        self._tasks: set[asyncio.Task[None]] = set()  # strong references while they run

    def file(self, renewals: Renewals, due: float) -> None:
        """File ``renewals`` under the slot of ``due``; arm the slot's timer for its earliest."""
        width = renewals.width
        key = (width, math.floor(due / width))
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = {}
        slot[renewals] = due
        renewals._slot = slot
        if due < self._armed.get(key, math.inf):
            self._armed[key] = due
            # In a context of its own: a batch must not carry one body's context variables.
            asyncio.get_running_loop().call_at(
                due, self._fire, key, due, context=contextvars.Context()
            )

    def _fire(self, key: tuple[float, int], when: float) -> None:
        """Renew every lease of the slot ``key`` (a loop callback; a stale timer does nothing)."""
        if self._armed.get(key) != when:
            return
        del self._armed[key]
        slot = self._slots.pop(key, {})
        woke = now()
        stores: dict[int, list[Renewals]] = {}
        for renewals, due in slot.items():
            if renewals._due(woke, due):
                if renewals._context is None:
                    stores.setdefault(id(renewals._leases), []).append(renewals)
                else:
                    renewals._alone(woke)
        loop = asyncio.get_running_loop()
        for batch in stores.values():
            many = batch[0]._leases.renew_many  # type: ignore[attr-defined]
            task = loop.create_task(self._renew_many(many, batch, woke))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _renew_many(many: RenewMany, batch: list[Renewals], woke: float) -> None:
        try:
            verdicts: Sequence[Lease | BaseException] = await many([r.lease for r in batch])
        except Exception as exc:  # a custom store's bug must still stop the bodies
            verdicts = [exc] * len(batch)
        for renewals, renewed in zip(batch, verdicts, strict=True):
            renewals._answered(renewed, woke)


clock = PerLoop(RenewalClock)
"""Return the running event loop's renewal clock (made on first use)."""
