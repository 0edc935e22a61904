"""One :meth:`JobEnvironment.run`: the hook and the faults of one trigger.

The executor's hook forwards to the run in progress (:class:`Current`); the
run records every step on the loop's clock, arms each fault where it is due
(a checkpoint, an acquire or renewal, a lease time, the completion) through
the public switches of :class:`MemoryLeases` and :class:`FaultyStore`, and
turns the executor's ending into a :class:`JobResult`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import final

import anyio

from .._events import Ending, Event, ExecutionEvent, LeaseEvent, Trigger
from .._execution import Executor
from .._history import Scalar, Step
from .._lease import Lease, now
from .._outcome import LeaseLostReason
from .._store import CompletionRequest, CompletionStore
from ._clock import stall
from ._faulty_store import BeforeComplete, FaultyStore
from ._job_faults import (
    FailRenewal,
    Fault,
    KeyTaken,
    LoseAtCheckpoint,
    Stall,
    StoreOutage,
    Superseded,
)
from ._job_result import JobResult, ended, execution_step, scalars
from ._memory_leases import MemoryLeases


@dataclass
class _Counts:
    """What the run counted of one execution so far (not a recorded `Execution`)."""

    renewals: int = 0
    checkpoints: int = 0


@dataclass
class Run:
    """One :meth:`JobEnvironment.run`: the hook and the faults of one trigger.

    ``executor`` runs it on ``leases`` and ``store`` (the environment's);
    ``lease_duration`` is what a takeover holds the key for; ``time_limit``
    bounds the run. Give it to :class:`Current` before :meth:`go`.
    """

    executor: Executor
    leases: MemoryLeases
    store: FaultyStore
    lease_duration: float
    time_limit: float
    trigger: Trigger
    job_key: str
    faults: Sequence[Fault]
    work_per_checkpoint: float
    retry: bool
    began: float = field(default_factory=now)
    steps: list[Step] = field(default_factory=list)
    finished: list[ExecutionEvent] = field(default_factory=list)
    executions: list[_Counts] = field(default_factory=list)
    indexes: dict[str, int] = field(default_factory=dict)  # execution id -> its index
    completion: str | None = None
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)

    async def go(self) -> JobResult:
        """Run the trigger through the executor with the faults armed; return how it ended."""
        self._arm_store(self.store)
        self.leases.at_checkpoints(self._checkpoint)
        ending: Ending | None = None
        try:
            with anyio.move_on_after(self.time_limit) as limit, self.scope:
                ending = await self.executor.run(self.trigger, self.job_key)
        finally:
            # What this run armed and did not use must not hit the next one.
            self.leases.at_checkpoints(None)
            for timer in self.timers:
                timer.cancel()
            self.store.clear()
            self.leases.clear_renewal_faults()
        if limit.cancelled_caught:
            raise RuntimeError(
                f"the trigger did not reach an end within {self.time_limit}s of lease time"
            )
        return self._result(ending)

    # -- the hook ---------------------------------------------------------------------

    def __call__(self, event: Event) -> None:
        """Record an execution or lease event of this run's executions."""
        if isinstance(event, LeaseEvent):
            if event.attempt is not None and event.attempt.execution_id in self.indexes:
                self.on_lease_event(self.indexes[event.attempt.execution_id], event)
        elif isinstance(event, ExecutionEvent):
            if event.event == "acquiring":  # a new execution: its lease events follow
                self.indexes[event.execution_id] = len(self.executions)
                self.executions.append(_Counts())
            else:
                self.on_event(event)

    def on_event(self, event: ExecutionEvent) -> None:
        """Record an execution event; without ``retry``, a retry ends the run."""
        self.steps.append(execution_step(event, at=now() - self.began))
        if event.event == "finished":
            self.finished.append(event)
        elif event.event == "completion":
            self.completion = event.reason
        elif event.event == "retry" and not self.retry:
            self.scope.cancel()  # at the executor's backoff sleep, before the next execution

    def on_lease_event(self, index: int, event: LeaseEvent) -> None:
        """Record a lease event and arm the faults that count from it."""
        attrs = scalars(
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

    def _arm_lease(self, event: LeaseEvent, execution: _Counts) -> None:
        for fault in self.faults:
            if isinstance(fault, FailRenewal):
                # Armed once the renewal before it is confirmed (for the first: the acquire).
                before = "acquired" if fault.n == 1 else "renewed"
                if event.name == before and execution.renewals == fault.n - 1:
                    self.leases.fail_renewals(fault.how)
                    self._fault("fail_renewal", how=fault.how, n=fault.n)
            elif isinstance(fault, KeyTaken) and event.name == "acquired":
                loop = asyncio.get_running_loop()
                self.timers.append(loop.call_at(event.at + fault.after, self._take_key))

    def _take_key(self) -> None:
        self.leases.take(self.job_key, self.lease_duration)
        self._fault("key_taken")

    def _takeover(self, fault: Superseded) -> BeforeComplete:
        async def take_over(inner: CompletionStore, request: CompletionRequest) -> None:
            other = self.leases.take(self.job_key, self.lease_duration)
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

    async def _checkpoint(self, lease: Lease) -> LeaseLostReason | None:
        """Count the checkpoint, let the work's time pass, apply its faults (at checkpoints)."""
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
                    self.leases.delete(lease.key)
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


@final
class Current:
    """The executor's hook: it forwards to the run in progress (one at a time)."""

    accepts = (ExecutionEvent, LeaseEvent)

    def __init__(self) -> None:
        self.run: Run | None = None

    def __call__(self, event: Event) -> None:
        if self.run is not None:
            self.run(event)

    async def go(self, run: Run) -> JobResult:
        """Make ``run`` the one in progress while it goes; refuse a second one meanwhile."""
        if self.run is not None:
            raise RuntimeError("a JobEnvironment runs one trigger at a time")
        self.run = run
        try:
            return await run.go()
        finally:
            self.run = None
