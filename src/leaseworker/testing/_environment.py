"""``JobEnvironment``: run a user's job on one trigger through the pod's executor, in memory.

The executor is the pod's own (store lookup, lease, claim, ``run(ctx)``,
completion, outcome), on :class:`MemoryLeases` and the ``memory://``
completion store, with an observer that records every lifecycle step on the
loop's clock. Faults (``_faults``) are applied through the lease store, the
completion store and the held lease's checkpoint probe; nothing in the
executor knows it is under test. See docs/testing.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from contextvars import Token
from dataclasses import dataclass, field
from typing import Any, cast, final

import anyio

from .._errors import LeaseLost, MalformedTrigger
from .._execution import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Ending,
    ExecutionEvent,
    Executor,
    ReportJob,
    Trigger,
    completion_key,
    resolve_job_key,
)
from .._history import Scalar, Step
from .._lease import HeldLease, LeaseEvent, LeaseObserver, now
from .._lease._hold import CheckpointProbe, checkpoint_probe
from .._outcome import JOB_FAILURES, EndingReason, LeaseLostReason, Outcome
from .._store import Completion, CompletionRequest, CompletionStore
from .._store._memory import MemoryStore
from ._clock import run_in_virtual_time, stall
from ._faults import (
    FailRenewal,
    Fault,
    KeyTaken,
    LoseAtCheckpoint,
    Stall,
    StoreOutage,
    Superseded,
)
from ._leases import MemoryLeases
from ._store import BeforeComplete, FaultyStore
from ._triggers import Headers, decode_record

TIME_LIMIT = 7 * 24 * 3600.0
"""The default ``time_limit``: a run that has not ended after a week of lease time fails."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobResult:
    """How one trigger ended in a :class:`JobEnvironment`, and every step on the way.

    ``outcome`` is the last execution's (``None`` when the record never became
    a job); ``reason`` qualifies it: why the lease was lost (``rejected``,
    ``timeout``, ``late``, ``error``, ``deadline``, ...), ``stale``,
    ``store_unavailable``, a malformed record's reason, or whatever reason the
    executor gives. ``dead_letter`` is the reason a pod would dead-letter the
    trigger with (``None``: it would not); ``terminal`` whether a pod would
    commit its offset (``False``: it would retry). ``result`` is what ``run()``
    returned, ``fence`` the last execution's fence, ``completion`` the store's
    answer (``accepted``/``duplicate``/``stale``), ``error`` the exception
    behind the ending. ``events`` are the lifecycle steps in order, ``at``
    seconds after the run started (exact on virtual time): execution events
    (``started``, ``completion``, ``finished``, ``retry``), lease events
    (``acquired``, ``renewed``, ``lost``, ``cancel_requested``, ``stopped``,
    ``released``, ``release_failed``), ``checkpoint`` (``attrs["n"]``) and
    ``fault`` (``attrs["kind"]``).
    """

    job_key: str | None
    outcome: Outcome | None
    reason: str | None = None
    dead_letter: str | None = None
    terminal: bool = True
    result: Any = None  # what run() returned; Any, so that a test can index it
    fence: int | None = None
    completion: str | None = None
    error: BaseException | None = None
    detail: str | None = None
    executions: int = 0
    checkpoints: int = 0
    events: tuple[Step, ...] = ()

    @property
    def names(self) -> list[str]:
        """The event names in order (``["acquired", "started", ...]``)."""
        return [event.name for event in self.events]

    def at(self, name: str) -> float:
        """Seconds after the start at which the first event ``name`` happened (``KeyError``)."""
        for event in self.events:
            if event.name == name:
                return event.at
        raise KeyError(f"no {name!r} event; events: {self.names}")

    def of(self, name: str) -> list[Step]:
        """Every event named ``name``, in order."""
        return [event for event in self.events if event.name == name]


@final
class JobEnvironment:
    """Run ``job`` on triggers as a pod would, without Kafka, Redis or a database.

    ::

        env = JobEnvironment(MonthlyReport())
        result = await env.run(make_trigger({"tenant": "acme", "period": "2026-11"}),
                               faults=[LoseAtCheckpoint(3)])
        assert (result.outcome, result.reason) == ("lost", "rejected")

    ``leases`` (a :class:`MemoryLeases`) and ``store`` (``memory://``) last as
    long as the environment, so a second run of the same trigger is answered
    ``duplicate``. ``run`` works on any asyncio loop; on a
    :class:`VirtualTimeLoop` (or through :meth:`run_sync`) lease time is
    virtual, so a 10-minute job takes milliseconds and every ``at`` is exact.
    ``work_per_checkpoint`` seconds pass (the loop free, as when the job awaits
    I/O) in each ``ctx.checkpoint()`` before it checks ownership: a stand-in
    for the work between checkpoints. A run that has not ended after
    ``time_limit`` seconds raises ``RuntimeError``: nothing loops forever.
    The executor is built here, as a pod builds it, so a job class a pod
    would refuse raises :class:`~leaseworker.ConfigError` here too. One run
    at a time.
    """

    def __init__(
        self,
        job: ReportJob,
        *,
        pod: str = "test-pod",
        leases: MemoryLeases | None = None,
        namespace: str = "leaseworker",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        time_limit: float = TIME_LIMIT,
    ) -> None:
        self.job = job
        self.time_limit = time_limit
        self.pod = pod
        self.leases = leases or MemoryLeases()
        self.store = MemoryStore()
        self.namespace = namespace
        self.max_payload_bytes = max_payload_bytes
        self._virtual_now = 0.0
        self._faulty = FaultyStore(self.store)
        self._current = _Current()
        # Built once, as a pod builds it: the job class is checked here (ConfigError).
        self._executor = Executor(
            job,
            self.leases,
            pod=pod,
            observer=self._current,
            lease_observers=self._current.lease_observer,
            store=self._faulty,
            store_namespace=namespace,
        )

    async def run(
        self,
        trigger: Trigger,
        *,
        faults: Sequence[Fault] = (),
        work_per_checkpoint: float = 0.0,
        retry: bool = False,
    ) -> JobResult:
        """Run ``trigger`` through the executor and return how it ended.

        Its job key comes from ``job.job_key()`` as in a pod; a malformed one
        is reported (``outcome=None``, ``dead_letter`` its reason), not raised.
        ``faults`` apply to the first execution. Without ``retry`` the run
        ends with the first execution a pod would retry (``lost``, ``busy``:
        ``terminal`` is ``False``); with it, executions follow until one ends
        the trigger, as in a pod.
        """
        try:
            job_key = resolve_job_key(self.job.job_key, trigger)
        except MalformedTrigger as exc:
            return _malformed(exc)
        attempt = _Run(self, trigger, job_key, faults, work_per_checkpoint, retry)
        return await attempt.go()

    async def run_record(
        self,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int = 0,
        offset: int = 0,
        headers: Headers | None = None,
        faults: Sequence[Fault] = (),
        work_per_checkpoint: float = 0.0,
        retry: bool = False,
    ) -> JobResult:
        """Decode raw record bytes as a pod does, then :meth:`run` the trigger.

        A record that cannot become a job ends with ``outcome=None`` and
        ``dead_letter`` set to the pod's reason (``not_json``, ``too_large``,
        ``no_job_key``, ``job_key_error``, ...).
        """
        try:
            trigger, _ = decode_record(
                self.job,
                value,
                key=key,
                partition=partition,
                offset=offset,
                headers=headers,
                max_payload_bytes=self.max_payload_bytes,
            )
        except MalformedTrigger as exc:
            return _malformed(exc)
        return await self.run(
            trigger, faults=faults, work_per_checkpoint=work_per_checkpoint, retry=retry
        )

    def run_sync(
        self,
        trigger: Trigger,
        *,
        faults: Sequence[Fault] = (),
        work_per_checkpoint: float = 0.0,
        retry: bool = False,
    ) -> JobResult:
        """:meth:`run` on a fresh :class:`VirtualTimeLoop`, from a plain (non-async) test.

        Virtual time goes on from where the previous ``run_sync`` left it.
        """
        run = self.run(trigger, faults=faults, work_per_checkpoint=work_per_checkpoint, retry=retry)
        return run_in_virtual_time(self._timed(run), start=self._virtual_now)

    def run_record_sync(
        self, value: bytes | None, *, key: bytes | None = None, faults: Sequence[Fault] = ()
    ) -> JobResult:
        """:meth:`run_record` on a fresh :class:`VirtualTimeLoop` (see :meth:`run_sync`)."""
        run = self.run_record(value, key=key, faults=faults)
        return run_in_virtual_time(self._timed(run), start=self._virtual_now)

    async def completion(self, job_key: str) -> Completion | None:
        """Return the job key's winning completion in the store, or ``None``."""
        return await self.store.state(completion_key(self.namespace, job_key))

    async def _timed(self, run: Coroutine[Any, Any, JobResult]) -> JobResult:
        try:
            return await run
        finally:
            self._virtual_now = now()


def _malformed(exc: MalformedTrigger) -> JobResult:
    return JobResult(
        job_key=None, outcome=None, reason=exc.reason, dead_letter=exc.reason, detail=exc.detail
    )


@dataclass
class _Execution:
    """What the run knows of one execution so far."""

    renewals: int = 0
    checkpoints: int = 0


@dataclass
class _Run:
    """One :meth:`JobEnvironment.run`: the observer, the probe and the faults of one trigger."""

    env: JobEnvironment
    trigger: Trigger
    job_key: str
    faults: Sequence[Fault]
    work_per_checkpoint: float
    retry: bool
    began: float = field(default_factory=now)
    steps: list[Step] = field(default_factory=list)
    finished: list[ExecutionEvent] = field(default_factory=list)
    executions: list[_Execution] = field(default_factory=list)
    completion: str | None = None
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)

    async def go(self) -> JobResult:
        env = self.env
        if env._current.run is not None:
            raise RuntimeError("a JobEnvironment runs one trigger at a time")
        env._current.run = self
        self._arm_store(env._faulty)
        probe: CheckpointProbe = self._checkpoint
        token: Token[CheckpointProbe | None] = checkpoint_probe.set(probe)
        ending: Ending | None = None
        try:
            with anyio.move_on_after(env.time_limit) as limit, self.scope:
                ending = await env._executor.run(self.trigger, self.job_key)
        finally:
            # What this run armed and did not use must not hit the next one.
            checkpoint_probe.reset(token)
            for timer in self.timers:
                timer.cancel()
            env._faulty.clear()
            env.leases.clear_renewal_faults()
            env._current.run = None
        if limit.cancelled_caught:
            raise RuntimeError(
                f"the trigger did not reach an end within {self.env.time_limit}s of lease time"
            )
        return self._result(ending)

    # -- the observers ----------------------------------------------------------------

    def on_event(self, event: ExecutionEvent) -> None:
        """Record an execution event; without ``retry``, a retry ends the run."""
        self.steps.append(execution_step(event, at=now() - self.began))
        if event.event == "finished":
            self.finished.append(event)
        elif event.event == "completion":
            self.completion = event.reason
        elif event.event == "retry" and not self.retry:
            self.scope.cancel()  # at the executor's backoff sleep, before the next execution

    def lease_observer(self) -> LeaseObserver:
        """Return the lease observer of the run's next execution."""
        self.executions.append(_Execution())
        return _LeaseSteps(self, len(self.executions) - 1)

    def on_lease_event(self, index: int, event: LeaseEvent) -> None:
        """Record a lease event and arm the faults that count from it."""
        attrs = _scalars(
            fence=event.fence,
            reason=event.reason,
            detail=event.detail,
            remaining=event.remaining,
            stop_latency=event.stop_latency,
            deleted=event.deleted,
        )
        self._step(event.name, attrs)
        execution = self.executions[index]
        if event.name == "renewed":
            execution.renewals += 1
        if index == 0:
            self._arm_lease(event, execution)

    def _step(self, name: str, attrs: dict[str, Scalar]) -> None:
        self.steps.append(Step(at=now() - self.began, name=name, attrs=attrs))

    # -- faults -----------------------------------------------------------------------

    def _arm_store(self, store: FaultyStore) -> None:
        for fault in self.faults:
            if isinstance(fault, StoreOutage):
                store.outage(fault.during, fault.calls)
            elif isinstance(fault, Superseded):
                store.before_next_complete(self._takeover(fault))

    def _arm_lease(self, event: LeaseEvent, execution: _Execution) -> None:
        for fault in self.faults:
            if isinstance(fault, FailRenewal):
                # Armed once the renewal before it is confirmed (for the first: the acquire).
                before = "acquired" if fault.n == 1 else "renewed"
                if event.name == before and execution.renewals == fault.n - 1:
                    self.env.leases.fail_renewals(fault.how)
                    self._fault("fail_renewal", how=fault.how, n=fault.n)
            elif isinstance(fault, KeyTaken) and event.name == "acquired":
                loop = asyncio.get_running_loop()
                self.timers.append(loop.call_at(event.at + fault.after, self._take_key))

    def _take_key(self) -> None:
        self.env.leases.take(self.job_key, self.env.job.lease_duration)
        self._fault("key_taken")

    def _takeover(self, fault: Superseded) -> BeforeComplete:
        async def take_over(inner: CompletionStore, request: CompletionRequest) -> None:
            other = self.env.leases.take(self.job_key, self.env.job.lease_duration)
            await inner.claim(request.job_key, request.input_version, other.fence)
            if fault.completed:
                await inner.complete(
                    CompletionRequest(
                        job_key=request.job_key,
                        input_version=request.input_version,
                        fence=other.fence,
                        result=request.result,
                        execution_id="another-execution",
                        pod="another-pod",
                    )
                )
            self._fault("superseded", fence=other.fence, completed=fault.completed)

        return take_over

    async def _checkpoint(self, held: HeldLease) -> LeaseLostReason | None:
        """Count the checkpoint, let the work's time pass, apply its faults (the probe)."""
        index = len(self.executions) - 1
        execution = self.executions[index]
        execution.checkpoints += 1
        n = execution.checkpoints
        self._step("checkpoint", {"n": n})
        if self.work_per_checkpoint > 0:
            await anyio.sleep(self.work_per_checkpoint)
        if index != 0:
            return None
        for fault in self.faults:
            if isinstance(fault, Stall) and fault.n == n:
                self._fault("stall", seconds=fault.seconds)
                stall(fault.seconds)
            elif isinstance(fault, LoseAtCheckpoint) and fault.n == n:
                if fault.reason == "rejected":
                    self.env.leases.delete(held.key)
                self._fault("lose_at_checkpoint", reason=fault.reason)
                return fault.reason
        return None

    def _fault(self, kind: str, **attrs: Scalar) -> None:
        self._step("fault", {"kind": kind, **attrs})

    # -- the result -------------------------------------------------------------------

    def _result(self, ending: Ending | None) -> JobResult:
        if not self.finished:
            # The one ending the executor reports without a `finished` event: the store
            # could not be asked whether the trigger completed, so nothing started.
            assert ending is None
            return JobResult(
                job_key=self.job_key,
                outcome="lost",
                reason="store_unavailable",
                terminal=False,
                events=tuple(self.steps),
            )
        return ended(
            self.job_key,
            self.finished[-1],
            ending=ending,
            completion=self.completion,
            executions=len(self.executions),
            checkpoints=sum(e.checkpoints for e in self.executions),
            events=tuple(self.steps),
        )


def ended(
    job_key: str,
    last: ExecutionEvent,
    *,
    ending: Ending | None = None,
    completion: str | None = None,
    executions: int = 1,
    checkpoints: int = 0,
    events: tuple[Step, ...] = (),
) -> JobResult:
    """Build the result of a trigger whose last execution reported ``last`` (``finished``).

    ``ending`` is what the executor returned, when known; otherwise it is read
    from the event (a run stopped at a retry, a pod's trigger).
    """
    if ending is None:
        ending = Ending(last.outcome or "failed", reason=cast(EndingReason | None, last.reason))
    reason: str | None = ending.reason
    if reason is None and isinstance(last.error, LeaseLost):
        reason = last.error.reason
    return JobResult(
        job_key=job_key,
        outcome=ending.outcome,
        reason=reason,
        dead_letter=_dead_letter(ending),
        terminal=ending.terminal,
        result=last.result,
        fence=last.fence,
        completion=completion,
        error=last.error,
        executions=executions,
        checkpoints=checkpoints,
        events=events,
    )


@final
class _Current:
    """The executor's observers: they forward to the run in progress (one at a time)."""

    def __init__(self) -> None:
        self.run: _Run | None = None

    def on_event(self, event: ExecutionEvent) -> None:
        if self.run is not None:
            self.run.on_event(event)

    def lease_observer(self, trigger: Trigger, job_key: str, execution_id: str) -> LeaseObserver:
        assert self.run is not None  # executions run only inside a run
        return self.run.lease_observer()


@final
class _LeaseSteps:
    """The lease observer of one execution: forwards to the run with its index."""

    def __init__(self, run: _Run, index: int) -> None:
        self._run = run
        self._index = index

    def on_lease_event(self, event: LeaseEvent) -> None:
        self._run.on_lease_event(self._index, event)


def execution_step(event: ExecutionEvent, *, at: float) -> Step:
    """Return ``event`` as a step at ``at``, with its outcome, reason and fence."""
    attrs = _scalars(outcome=event.outcome, reason=event.reason, fence=event.fence)
    return Step(at=at, name=event.event, attrs=attrs)


def _scalars(**fields: Scalar | None) -> dict[str, Scalar]:
    return {name: value for name, value in fields.items() if value is not None}


def _dead_letter(ending: Ending) -> str | None:
    """Return the reason a pod dead-letters a trigger that ended so (``None``: it does not)."""
    # Ending.dead_letter, where the executor defines it (it then names every refusal too).
    named: str | None = getattr(ending, "dead_letter", None)
    return named if named is not None else JOB_FAILURES.get(ending.outcome)
