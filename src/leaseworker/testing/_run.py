"""One :meth:`JobEnvironment.run`: the observer, the checkpoint probe and the faults of a trigger.

The executor's observers forward to the run in progress (``_Current``); the
run records every step on the loop's clock, arms each fault where it is due
(a checkpoint, an acquire or renewal, a lease time, the completion) and turns
the executor's ending into a :class:`JobResult`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextvars import Token
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, final

import anyio

from .._execution import Ending, ExecutionEvent, Trigger
from .._history import Scalar, Step
from .._lease import HeldLease, LeaseEvent, LeaseObserver, now
from .._lease._hold import CheckpointProbe, checkpoint_probe
from .._outcome import LeaseLostReason
from .._store import CompletionRequest, CompletionStore
from ._clock import stall
from ._faults import (
    FailRenewal,
    Fault,
    KeyTaken,
    LoseAtCheckpoint,
    Stall,
    StoreOutage,
    Superseded,
)
from ._result import JobResult, ended, execution_step, scalars
from ._store import BeforeComplete, FaultyStore

if TYPE_CHECKING:
    from ._environment import JobEnvironment


@dataclass
class _Execution:
    """What the run knows of one execution so far."""

    renewals: int = 0
    checkpoints: int = 0


@dataclass
class Run:
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


@final
class Current:
    """The executor's observers: they forward to the run in progress (one at a time)."""

    def __init__(self) -> None:
        self.run: Run | None = None

    def on_event(self, event: ExecutionEvent) -> None:
        if self.run is not None:
            self.run.on_event(event)

    def lease_observer(self, trigger: Trigger, job_key: str, execution_id: str) -> LeaseObserver:
        assert self.run is not None  # executions run only inside a run
        return self.run.lease_observer()


@final
class _LeaseSteps:
    """The lease observer of one execution: forwards to the run with its index."""

    def __init__(self, run: Run, index: int) -> None:
        self._run = run
        self._index = index

    def on_lease_event(self, event: LeaseEvent) -> None:
        self._run.on_lease_event(self._index, event)
