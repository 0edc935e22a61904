"""``hold()``: run a block of code only while its lease is certainly owned.

The body runs in a cancel scope whose deadline is the lease's local deadline
(and ``max_runtime``); :class:`~._renewals.Renewals` beside it renews on
schedule and pushes the deadline forward, and any doubt about ownership
cancels the scope for good. This module holds the guarantee (the scope, the
loss, the outcome, the release); ``_renewals`` holds the clock (the shared
renewal tick, what a missed deadline means); ``_releases`` batches the
releases of blocks that end together.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar, final

import anyio

from .._deprecated import keyword
from .._errors import LeaseBusy, LeaseLost, LeaseTimeout, LeaseUnavailable
from .._events import Attempt, Hook, Hooks, LeaseEvent, LeaseEventName, emit, hooks_for
from .._outcome import LeaseLostReason, Outcome
from .._process import Identity, Mirror, ProcessContext, ProcessPool, Usage
from ._model import Lease, LeaseStore
from ._releases import ReleaseMany, releases
from ._renewals import Renewals
from ._timing import LeaseTiming, now

logger = logging.getLogger("leaseworker.lease")

_P = ParamSpec("_P")
_T = TypeVar("_T")

CheckpointFaults = Callable[[Lease], Awaitable[LeaseLostReason | None]]
"""A lease store's optional ``checkpoint(lease)``: a reason it returns makes ownership uncertain."""


class LeaseObserver(Protocol):
    """Deprecated: pass ``hooks=`` to :func:`hold`; an observer is adapted to one."""

    def on_lease_event(self, event: LeaseEvent) -> None:
        """Handle one lease event."""
        ...


def hold(
    leases: LeaseStore,
    key: str,
    *,
    lease_duration: float | None = None,
    renewal_interval: float | None = None,
    max_runtime: float | None = None,
    release_timeout: float | None = None,
    hooks: Iterable[Hook] = (),
    lease_note: Callable[[], str] | None = None,
    processes: ProcessPool | None = None,
    observer: LeaseObserver | None = None,
    ttl: float | None = None,
    renew_every: float | None = None,
) -> HeldLease:
    """Hold the lease for ``key`` while the ``async with`` body runs.

    ::

        async with hold(leases, "report:acme:2026-11", lease_duration=30, max_runtime=600) as held:
            for batch in batches:
                await held.checkpoint()        # raises LeaseLost once ownership is uncertain
                await write(batch, fence=held.fence)

    Raises :class:`LeaseBusy` when another owner holds the lease,
    :class:`LeaseLost` when ownership became uncertain (the body was cancelled
    at its next await), :class:`LeaseTimeout` when the body outlived
    ``max_runtime``. Settings that cannot keep the lease are rejected here, with
    :class:`~leaseworker.ConfigError`, before anything touches Redis.
    ``renewal_interval`` defaults to ``lease_duration / 3``; ``release_timeout`` to the store's
    command timeout (a batched release, see below: twice it for the batch,
    from its send). ``hooks`` receive a :class:`LeaseEvent` for every step
    (acquired, renewed, lost, cancel requested, stopped, released).
    ``lease_note()`` returns a short text stored with the acquisition (the
    pod's telemetry: its trace reference); the next acquisition of the key
    gets it back as ``LeaseEvent.previous``. ``observer`` (deprecated) is an
    object with ``on_lease_event(event)`` and optionally ``lease_note()``;
    ``ttl`` and ``renew_every`` are the deprecated spellings of
    ``lease_duration`` and ``renewal_interval``. ``processes`` is the pool
    :meth:`HeldLease.run_in_process` runs its calls in (default: the process's
    shared :meth:`ProcessPool.default`).
    A lease store that defines ``async checkpoint(lease)`` is asked at every
    :meth:`HeldLease.checkpoint`; a loss reason it returns makes ownership
    uncertain there (``leaseworker.testing.MemoryLeases``: work time and
    injected losses). Other stores cost one attribute test per checkpoint.
    A store that defines ``renew_many(leases)`` and ``release_many(leases)``
    (``RedisLeases``) renews the held leases due together, and releases those
    ending together, in shared batches; others are called once per lease.
    """
    if ttl is not None or renew_every is not None:  # deprecated spellings: off the usual path
        lease_duration = keyword("hold()", "ttl", ttl, "lease_duration", lease_duration)
        renewal_interval = keyword(
            "hold()", "renew_every", renew_every, "renewal_interval", renewal_interval
        )
    if lease_duration is None:
        raise TypeError("hold() missing required keyword argument: 'lease_duration'")
    if observer is not None:
        hooks = (*hooks, _ObserverHook(observer))
        lease_note = lease_note or getattr(observer, "lease_note", None)
    timing = LeaseTiming.resolve(
        lease_duration=lease_duration,
        renewal_interval=renewal_interval,
        max_runtime=max_runtime,
        policy=leases.policy,
    )
    if processes is not None and processes.workers:  # checked once, as the timing is
        leases.policy.check_stop_room(processes.stop_allowance)
    return HeldLease(
        leases,
        key,
        timing=timing,
        release_timeout=release_timeout or leases.policy.command_timeout,
        hooks=hooks_for(hooks, LeaseEvent),
        lease_note=lease_note,
        processes=processes,
    )


@final
class _ObserverHook:
    """A deprecated ``LeaseObserver`` as a hook: it gets the lease events only."""

    def __init__(self, observer: LeaseObserver) -> None:
        self._observer = observer

    def __call__(self, event: object) -> None:
        if isinstance(event, LeaseEvent):
            self._observer.on_lease_event(event)


@final
class HeldLease:
    """A lease held for the duration of an ``async with`` block; see :func:`hold`.

    Inside the block it tells the body whether ownership is still certain
    (``owned``, ``remaining()``, ``checkpoint()``) and carries the ``fence`` to
    pass to destinations. After the block, ``outcome``, ``released`` and
    ``release_error`` say how it ended; a failed release is reported there and
    in the log, never instead of the body's own outcome. ``attempt`` (the
    executor's) goes into every event, and its execution id and pod into every
    record it logs, beside ``log_fields``. ``log_fields`` go
    into every record it logs (the executor passes ``executionId`` and
    ``pod``); ``loss_log_level`` is the level of its ``lease_lost`` record
    (the executor's own ``finished`` record reports the loss at WARNING, so
    it passes DEBUG: one loss, one warning). ``processes``: the pool of
    :meth:`run_in_process`, checked against the lease's margin by whoever
    resolved ``timing`` (:func:`hold`, the executor).
    """

    def __init__(
        self,
        leases: LeaseStore,
        key: str,
        *,
        timing: LeaseTiming,
        release_timeout: float,
        hooks: Hooks = (),
        lease_note: Callable[[], str] | None = None,
        attempt: Attempt | None = None,
        log_fields: Mapping[str, object] | None = None,
        loss_log_level: int = logging.WARNING,
        processes: ProcessPool | None = None,
    ) -> None:
        self._processes = processes
        self._mirrors: list[Mirror] = []  # the children running for this block, while they run
        self._cpu_seconds = 0.0
        self._peak_memory = 0
        self._process_calls = 0
        self._identity: Identity | None = None  # what its run_in_process calls carry
        self._leases = leases
        self._attempt = attempt
        self._log_fields = log_fields or {}  # read only when a record is logged
        if attempt is not None:
            self._log_fields = {
                "executionId": attempt.execution_id,
                "pod": attempt.pod,
                **self._log_fields,
            }
        self._loss_log_level = loss_log_level
        self._hooks = hooks
        self._lease_note = lease_note
        self._key = key
        self._timing = timing
        self._release_timeout = release_timeout
        self._lease: Lease | None = None
        self._runtime_deadline = math.inf
        self._scope: anyio.CancelScope  # the body's, from __aenter__ on
        self._renewals: Renewals | None = None  # from __aenter__ on
        self._loss: tuple[LeaseLostReason, str, float] | None = None  # reason, detail, when
        self._outcome: Outcome | None = None
        self._released: bool | None = None
        self._release_error: BaseException | None = None
        self._faults: CheckpointFaults | None = getattr(leases, "checkpoint", None)

    @property
    def key(self) -> str:
        """The job key this lease guards."""
        return self._key

    @property
    def lease(self) -> Lease:
        """The current lease (replaced after every confirmed renewal)."""
        if self._lease is None:
            raise RuntimeError("the lease is not acquired yet; use `async with hold(...)`")
        return self._lease

    @property
    def fence(self) -> int:
        """The fencing token of this acquisition; destinations reject older ones."""
        return self.lease.fence

    @property
    def owned(self) -> bool:
        """Whether ownership is still certain right now."""
        return self._lease is not None and self._loss is None and now() < self._lease.local_deadline

    def remaining(self) -> float:
        """Seconds until the local deadline, 0 once ownership is uncertain."""
        return self.lease.remaining() if self.owned else 0.0

    async def checkpoint(self) -> None:
        """Raise :class:`LeaseLost` if ownership is uncertain, else yield to the loop."""
        await self._verify()
        await anyio.lowlevel.checkpoint()

    async def _verify(self) -> None:
        """Raise :class:`LeaseLost` if ownership is uncertain (a test's fault asked first)."""
        if self._faults is not None and (injected := await self._faults(self.lease)) is not None:
            self._lose(injected, "the lease store found it lost at a checkpoint", at=now())
        if not self.owned:
            if self._loss is None:
                # The deadline passed but its timer has not run yet.
                self._lose(*self._unconfirmed(), at=self.lease.local_deadline)
            raise self._lost_error(now())

    @property
    def outcome(self) -> Outcome | None:
        """How the block ended; ``None`` while it runs."""
        return self._outcome

    @property
    def loss_reason(self) -> LeaseLostReason | None:
        """Why ownership became uncertain, once it did; ``None`` while it is certain."""
        return None if self._loss is None else self._loss[0]

    @property
    def released(self) -> bool | None:
        """Whether the release deleted this owner's key; ``None`` if it did not answer."""
        return self._released

    @property
    def release_error(self) -> BaseException | None:
        """Why the release failed, if it did (reported here, never raised)."""
        return self._release_error

    @property
    def renewals(self) -> int:
        """How many renewals were confirmed."""
        return 0 if self._renewals is None else self._renewals.confirmed

    @property
    def max_loop_lag(self) -> float:
        """The largest lag behind its due time a renewal of this lease was sent with, in seconds."""
        return 0.0 if self._renewals is None else self._renewals.max_loop_lag

    @property
    def process_calls(self) -> int:
        """How many :meth:`run_in_process` calls this block made (ended, however they ended)."""
        return self._process_calls

    @property
    def cpu_seconds(self) -> float:
        """CPU seconds (user + system) the block's child processes spent, killed ones included."""
        return self._cpu_seconds

    @property
    def peak_memory(self) -> int:
        """The highest peak RSS, in bytes, of any of the block's :meth:`run_in_process` calls."""
        return self._peak_memory

    async def run_in_process(
        self,
        fn: Callable[Concatenate[ProcessContext, _P], _T],
        /,
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> _T:
        """Run ``fn(pctx, *args, **kwargs)`` in a child process while the lease is held.

        For work that never awaits (a CPU loop, a synchronous driver): ``fn``
        is an importable function, its arguments and its result picklable.
        ``pctx`` (a :class:`ProcessContext`) tells the child whether ownership
        is still certain, from memory it shares with this pod. Once it is not
        (a lost or late renewal, the local deadline, ``max_runtime``, an
        outer cancellation), the child's whole process group is killed at
        once and reaped before this raises, and a child whose pod cannot act
        (paused, blocked) kills itself at the last deadline it was given. A
        child that died by itself raises :class:`~leaseworker.ChildProcessDied`.
        """
        # LeaseLost, or the body's cancellation, before any child is used; no turn of the
        # loop otherwise (the pool's call gives one), nor a coroutine when nothing is to ask.
        if self._faults is not None or not self.owned:
            await self._verify()
        if self._runtime_deadline <= now():  # due, its timer not run yet: what it would do
            self._scope.cancel()
        if self._scope.cancel_called:
            await anyio.lowlevel.checkpoint()
        pool = self._processes
        if pool is None:
            pool = ProcessPool.default()
            self._leases.policy.check_stop_room(pool.stop_allowance)
        if self._identity is None:  # one per block: a hold() without an attempt names it once
            attempt = self._attempt
            self._identity = Identity(
                job_key=self._key,
                execution_id=uuid.uuid4().hex if attempt is None else attempt.execution_id,
                fence=self.fence,
            )
        return await pool.run(
            fn,
            args,
            dict(kwargs),
            identity=self._identity,
            deadline=_on_monotonic(self._body_deadline()),
            follow=self._follow,
            usage=self._used,
        )

    def _follow(self, mirror: Mirror) -> Callable[[], None]:
        """Push this block's deadline and loss into ``mirror`` until the call ends."""
        self._mirrors.append(mirror)
        if self._loss is not None:  # lost between the checkpoint and the child's start
            mirror.lose(self._loss[0])
        return lambda: self._mirrors.remove(mirror)

    def _used(self, usage: Usage) -> None:
        self._process_calls += 1
        self._cpu_seconds += usage.cpu_seconds
        self._peak_memory = max(self._peak_memory, usage.peak_memory)

    async def __aenter__(self) -> HeldLease:
        if self._lease is not None or self._outcome is not None:
            raise RuntimeError("a HeldLease can be entered only once")
        begun = now()
        note = self._note()
        if note:
            lease = await self._leases.acquire(self._key, self._timing.lease_duration, note=note)
        else:  # a store written before notes existed keeps working
            lease = await self._leases.acquire(self._key, self._timing.lease_duration)
        if lease is None:
            self._outcome = "busy"
            raise LeaseBusy(self._key, retry_after=await self._holder_ttl())
        self._lease = lease
        self._emit(
            "acquired",
            round_trip=now() - begun,
            remaining=lease.remaining(),
            previous=lease.previous,
            expires_at=lease.expires_at,
        )
        if self._timing.max_runtime is not None:
            self._runtime_deadline = now() + self._timing.max_runtime
        # Entered here and left in __aexit__: the body between them is the scope's.
        self._scope = anyio.CancelScope(deadline=self._body_deadline())
        self._scope.__enter__()
        self._renewals = Renewals(
            self._leases,
            lease,
            timing=self._timing,
            renewed=self._renewed,
            lose=lambda reason, detail, at, round_trip: self._lose(
                reason, detail, at=at, round_trip=round_trip
            ),
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        stopped_at = now()
        try:
            swallowed = bool(self._scope.__exit__(exc_type, exc, tb))
            # Judge before awaiting anything: the body has stopped, and a pending
            # outer cancellation may interrupt the awaits below.
            self._judge(stopped_at, None if swallowed else exc)
            if self._outcome == "lost":
                self._emit("stopped", stop_latency=self._lost_error(stopped_at).stop_latency)
        finally:
            assert self._renewals is not None  # made in __aenter__
            self._renewals.stop()
            await self._release()
        if swallowed:
            exc = None
        if self._outcome == "lost" and not isinstance(exc, LeaseLost):
            lost = self._lost_error(stopped_at)
            if exc is None:
                raise lost from None  # the cancellation that stopped the body is noise
            exc.add_note(f"leaseworker: {lost}")  # the body's own exception stays on top
        if self._outcome == "timed_out":
            max_runtime = self._timing.max_runtime
            assert max_runtime is not None
            timeout = LeaseTimeout(self._key, fence=self.fence, max_runtime=max_runtime)
            if exc is None:
                raise timeout from None  # the cancellation that stopped the body is noise
            # An outer cancellation (shutdown) or the body's own error while it was
            # stopping: it goes on, as it would without the timeout.
            exc.add_note(f"leaseworker: {timeout}")
        return swallowed

    def _judge(self, stopped_at: float, exc: BaseException | None) -> None:
        """Decide the outcome once the body stopped and the renewal task ended."""
        lease = self.lease
        if self._loss is None and self._scope.cancel_called:
            # Timed out only if the body also stopped in time: one that ran on past
            # the local deadline (a long cleanup, a blocked loop) may have overlapped
            # another holder, whatever cancelled it.
            if self._runtime_deadline <= stopped_at < lease.local_deadline:
                self._outcome = "timed_out"
                return
            self._lose(*self._unconfirmed(), at=lease.local_deadline)
        elif self._loss is None and stopped_at >= lease.local_deadline:
            # The body ran past the deadline without awaiting: the loop was blocked.
            self._lose(
                "loop_blocked",
                "the body kept the event loop busy past the deadline",
                at=lease.local_deadline,
            )
        if self._loss is not None:
            self._outcome = "lost"
        elif exc is None:
            self._outcome = "completed"
        elif isinstance(exc, anyio.get_cancelled_exc_class()):
            self._outcome = "cancelled"
        else:
            self._outcome = "failed"

    def _unconfirmed(self) -> tuple[LeaseLostReason, str]:
        """Say why the local deadline passed without a confirmed renewal (see ``Renewals``)."""
        assert self._renewals is not None  # the deadline is the acquired lease's
        return self._renewals.unconfirmed()

    def _renewed(self, lease: Lease, round_trip: float) -> None:
        """Take a confirmed renewal: a new lease, a later deadline for the body."""
        self._lease = lease
        self._scope.deadline = deadline = self._body_deadline()
        if self._mirrors:
            moved = _on_monotonic(deadline)
            for mirror in self._mirrors:
                mirror.move(moved)
        self._emit(
            "renewed",
            round_trip=round_trip,
            remaining=lease.remaining(),
            expires_at=lease.expires_at,
        )

    def _body_deadline(self) -> float:
        return min(self.lease.local_deadline, self._runtime_deadline)

    def _lose(
        self, reason: LeaseLostReason, detail: str, *, at: float, round_trip: float | None = None
    ) -> None:
        """Mark ownership uncertain for good and cancel the body.

        ``round_trip``: how long the renewal whose verdict this is took, if one did.
        """
        if self._loss is not None or (self._renewals is not None and self._renewals.stopping):
            return
        self._loss = (reason, detail, at)
        for mirror in self._mirrors:  # the children see it at their next checkpoint
            mirror.lose(reason)
        self._scope.cancel()  # and the pod kills them at once
        self._emit("lost", reason=reason, detail=detail, round_trip=round_trip)
        self._emit("cancel_requested", reason=reason)
        logger.log(
            self._loss_log_level,
            "lease lost for %r (fence %d): %s",
            self._key,
            self.fence,
            reason,
            extra=self._fields("lease_lost", reason=reason),
        )

    def _lost_error(self, stopped_at: float) -> LeaseLost:
        assert self._loss is not None
        reason, detail, lost_at = self._loss
        return LeaseLost(
            self._key,
            fence=self.fence,
            reason=reason,
            detail=detail,
            stop_latency=max(0.0, stopped_at - lost_at),
        )

    def _note(self) -> str:
        """Return the note for this acquisition (``""`` without one, or on failure)."""
        if self._lease_note is None:
            return ""
        try:
            return str(self._lease_note())
        except Exception:
            logger.exception("lease_note failed to give a note")
            return ""

    async def _holder_ttl(self) -> float | None:
        """Return the holder's remaining TTL: 0 if its lease ended since the refusal, None unknown.

        A busy pod waits for this hint (capped by its backoff): a key gone by the time it
        is read (it expired in between) must mean "now", not "unknown", which would wait
        a whole backoff step (seconds) past the expiry.
        """
        try:
            info = await self._leases.inspect(self._key)
        except LeaseUnavailable:
            return None
        return 0.0 if info.owner is None else info.ttl

    async def _release(self) -> None:
        """Release with its own timeout, shielded from the caller's cancellation.

        A store with ``release_many`` gets it in the batch of this loop turn's
        releases (``_releases``), timed from when that batch is sent.
        """
        begun = now()
        many: ReleaseMany | None = getattr(self._leases, "release_many", None)
        deadline = math.inf if many is not None else begun + self._release_timeout
        # One scope: shielded from the caller, cancelled by its own deadline.
        with anyio.CancelScope(shield=True, deadline=deadline) as scope:
            try:
                if many is not None:
                    answer = releases().release(many, self.lease, self._release_timeout)
                    self._released = await answer
                else:
                    self._released = await self._leases.release(self.lease)
            except Exception as exc:
                self._release_error = exc
        if scope.cancelled_caught:
            self._release_error = TimeoutError(
                f"release did not finish within {self._release_timeout}s"
            )
        round_trip = now() - begun
        if self._release_error is None:
            self._emit("released", round_trip=round_trip, deleted=self._released)
        else:
            self._emit("release_failed", round_trip=round_trip, error=self._release_error)
            logger.warning(
                "lease release failed for %r (fence %d): %s",
                self._key,
                self.fence,
                self._release_error,
                extra=self._fields("lease_release_failed"),
            )

    def _fields(self, event: str, **more: object) -> dict[str, object]:
        """Return a record's ``extra=``: event, job key, fence, ``log_fields``, ``more``."""
        return {"event": event, "jobId": self._key, "fence": self.fence, **self._log_fields, **more}

    def _emit(self, name: LeaseEventName, **fields: Any) -> None:
        """Tell the hooks, if any; a hook's failure is logged and never propagates."""
        if self._hooks:
            at = now()
            emit(
                self._hooks,
                LeaseEvent(
                    name=name,
                    key=self._key,
                    fence=self.fence,
                    at=at,
                    attempt=self._attempt,
                    **fields,
                ),
            )


def _on_monotonic(deadline: float) -> float:
    """Return ``deadline`` (on the lease clock, ``now()``) on ``time.monotonic()``'s clock.

    The same clock in a pod (asyncio's loop time is ``time.monotonic()``);
    apart under a test's virtual clock, where the child still needs real time.
    """
    return time.monotonic() + (deadline - now())
