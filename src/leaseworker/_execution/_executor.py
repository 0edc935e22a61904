"""Executions: run one trigger's job under its lease until a terminal outcome.

Each attempt looks the trigger up in the store, acquires the lease, claims the
job key with its fence, runs the job inside ``hold()`` and records its result;
``busy`` and ``lost`` are retried with backoff, so a job never runs unfenced.
See docs/design.md#the-executor.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import final

import anyio

from .._backoff import BusyPolicy
from .._errors import BadResult, ConfigError, LeaseBusy, LeaseUnavailable, StoreUnavailable
from .._lease import HeldLease, LeaseObserver, LeaseStore, now
from .._outcome import (
    JOB_FAILURES,
    REFUSALS,
    DeadLetterReason,
    EndingReason,
    LeaseLostReason,
    Outcome,
    ends_trigger,
)
from .._retry import LOST, Retries
from .._store import CompletionResult, CompletionStore, check_text
from ._checks import check_job_class
from ._completion import Completer, completion_key
from ._events import EventName, ExecutionEvent, ExecutionObserver
from ._job import JobContext, ReportJob
from ._trigger import Trigger

logger = logging.getLogger("leaseworker.execution")

LeaseObservers = Callable[[Trigger, str, str], LeaseObserver]
"""Return the lease observer of one execution, given (trigger, job key, execution id)."""


@dataclass(frozen=True, slots=True)
class Ending:
    """How a trigger's last execution ended: its outcome, why, and whether the trigger is done.

    ``error_type`` is the class name of the exception that made a ``failed`` or
    ``timed_out`` execution end (``None`` otherwise): the dead letter names it.
    Never its message, which may quote payload data. ``loss_reason`` is why a
    ``lost`` execution lost its lease (``None`` when it never held it);
    ``detail`` a one-line description leaseworker wrote, for a dead letter.
    """

    outcome: Outcome
    reason: EndingReason | None = None
    error_type: str | None = None
    loss_reason: LeaseLostReason | None = None
    detail: str | None = None

    @property
    def terminal(self) -> bool:
        """Whether the trigger is done (its offset may be committed); see :func:`ends_trigger`."""
        return ends_trigger(self.outcome, self.reason)

    @property
    def dead_letter(self) -> DeadLetterReason | None:
        """The reason the trigger is dead-lettered with, if this ending dead-letters it."""
        for refusal in REFUSALS:
            if self.reason == refusal:
                return refusal
        return JOB_FAILURES.get(self.outcome)

    @classmethod
    def of_error(
        cls, outcome: Outcome, error: BaseException, loss_reason: LeaseLostReason | None = None
    ) -> Ending:
        """Return the ending of an execution stopped by ``error`` (a failure keeps its type)."""
        error_type = type(error).__name__ if outcome in JOB_FAILURES else None
        if outcome == "failed" and isinstance(error, BadResult):
            return cls(outcome, reason="bad_result", error_type=error_type, detail=error.detail)
        return cls(outcome, error_type=error_type, loss_reason=loss_reason)


class _Losses:
    """The lease losses of one trigger's executions so far, against the job's loss budget."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.count = 0

    def charge(self, ending: Ending) -> Ending:
        """Count ``ending`` if it lost a held lease; once the budget is spent, end the trigger."""
        if ending.loss_reason is None:  # never held: Redis did not answer, or not a loss
            return ending
        self.count += 1
        if self.count < self.budget:
            return ending
        return Ending(
            "lost",
            reason="lost_repeatedly",
            error_type="LeaseLost",
            loss_reason=ending.loss_reason,
            detail=f"lost its lease on {self.count} executions in a row "
            f"(loss budget {self.budget}); the last loss: {ending.loss_reason}",
        )


class _Refused(ValueError):
    """Raised when a trigger's input version cannot be stored (``bad_input_version``)."""


class _Unclaimed(Exception):
    """Raised inside the hold when the claim says the job must not run; carries the ending."""

    def __init__(self, ending: Ending) -> None:
        super().__init__(ending.reason or ending.outcome)
        self.ending = ending


@final
class Executor:
    """Run triggers of one job class against one lease store, one trigger per call.

    ::

        executor = Executor(MonthlyReport(), RedisLeases(redis), pod="pod-1",
                            observer=LoggingObserver())
        ending = await executor.run(trigger, "report:acme:2026-11")  # ending.terminal

    Construction checks the job's lease settings (:class:`ConfigError`).
    The caller serialises calls for one job key within a pod; across pods the
    lease does it. With ``store``, completions are recorded (fenced) under
    ``{store_namespace}:{<job key>}`` (the lease namespace: fences are only
    comparable within it); without one, ``run``'s return value is only
    reported to the observer. ``loss_budget`` and ``max_result_bytes``
    override the job class's attributes of those names (``None``: the class's).
    """

    def __init__(
        self,
        job: ReportJob,
        leases: LeaseStore,
        *,
        pod: str,
        observer: ExecutionObserver,
        lost_retry: BusyPolicy = LOST,
        lease_observers: LeaseObservers | None = None,
        store: CompletionStore | None = None,
        store_namespace: str = "leaseworker",
        loss_budget: int | None = None,
        max_result_bytes: int | None = None,
    ) -> None:
        check_job_class(type(job))
        self._loss_budget = job.loss_budget if loss_budget is None else loss_budget
        self._max_result_bytes = (
            job.max_result_bytes if max_result_bytes is None else max_result_bytes
        )
        self._job = job
        self._store = store
        self._store_namespace = store_namespace
        self._leases = leases
        self._timing = job.lease_timing(leases.policy)
        self._pod = pod
        self._observer = observer
        self._lost_retry = lost_retry
        self._lease_observers = lease_observers

    async def run(self, trigger: Trigger, job_key: str) -> Ending:
        """Run executions of ``job_key`` until one reaches a terminal outcome; return it."""
        retries = {"busy": Retries(self._job.busy_policy), "lost": Retries(self._lost_retry)}
        try:
            version = self._input_version(trigger)
        except Exception as exc:  # the trigger fails (and is dead-lettered): the job never ran
            ending = Ending.of_error("failed", exc)
            if isinstance(exc, _Refused):  # not the job's bug: the trigger's data
                ending = Ending("failed", reason="bad_input_version", detail=str(exc))
            self._emit(
                "finished",
                trigger,
                job_key,
                uuid.uuid4().hex,
                0.0,
                outcome="failed",
                reason=ending.reason,
                error=exc,
            )
            return ending
        losses = _Losses(self._loss_budget)
        while True:
            execution_id = uuid.uuid4().hex
            ending, hint = await self._attempt(trigger, job_key, version, execution_id, losses)
            if ending.terminal:
                return ending
            kind = "busy" if ending.outcome == "busy" else "lost"
            emit = functools.partial(self._emit_retry, trigger, job_key, execution_id, ending)
            await retries[kind].wait(emit, hint=hint)

    def _emit_retry(
        self,
        trigger: Trigger,
        job_key: str,
        execution_id: str,
        ending: Ending,
        delay: float,
        attempt: int,
    ) -> None:
        self._emit(
            "retry",
            trigger,
            job_key,
            execution_id,
            0.0,
            outcome=ending.outcome,
            reason=ending.reason,
            retry_in=delay,
        )

    def _input_version(self, trigger: Trigger) -> str:
        """Return the trigger's input version; raise if no completion store could keep it.

        The payload's ``inputVersion`` comes from JSON, which lets NUL and lone
        surrogates through: such a trigger fails here (and is dead-lettered)
        instead of failing every store call on the way.
        """
        version = self._job.input_version(trigger)
        if not isinstance(version, str):
            raise _Refused(f"input_version() returned a {type(version).__name__}, not a str")
        try:
            check_text("input version", version, empty_ok=True)
        except ConfigError as exc:  # the trigger's data, not the pod's configuration
            raise _Refused(str(exc)) from None
        return version

    async def _attempt(
        self, trigger: Trigger, job_key: str, version: str, execution_id: str, losses: _Losses
    ) -> tuple[Ending, float | None]:
        """Answer from the store if the identity completed, else run one execution."""
        if self._store is not None:
            begun = now()
            try:
                earlier = await self._store.lookup(self._key(job_key), version)
            except StoreUnavailable as exc:
                # Not knowing is not a reason to run: back off as for an unconfirmed lease.
                logger.warning(
                    "%s; job %r waits for it",
                    exc,
                    job_key,
                    extra={
                        "event": "store_unavailable",
                        "jobId": job_key,
                        "executionId": execution_id,
                        "pod": self._pod,
                    },
                )
                return Ending("lost", reason="store_unavailable"), None
            if earlier is not None:
                elapsed = now() - begun
                self._emit("finished", trigger, job_key, execution_id, elapsed, outcome="duplicate")
                return Ending("duplicate"), None
        return await self._execute(trigger, job_key, version, execution_id, losses)

    def _key(self, job_key: str) -> str:
        return completion_key(self._store_namespace, job_key)

    async def _execute(
        self, trigger: Trigger, job_key: str, version: str, execution_id: str, losses: _Losses
    ) -> tuple[Ending, float | None]:
        """One execution; return how it ended and, when busy, the holder's remaining TTL."""
        held = HeldLease(  # hold(), with the timing resolved once in __init__
            self._leases,
            job_key,
            timing=self._timing,
            release_timeout=self._leases.policy.command_timeout,
            observer=self._lease_observer(trigger, job_key, execution_id),
            log_fields={"executionId": execution_id, "pod": self._pod},
            loss_log_level=logging.DEBUG,  # the ``finished`` record warns of the loss
        )
        begun = now()
        result: object = None
        completer = self._completer(held, job_key, version, execution_id)
        try:
            async with held:
                self._emit(
                    "started",
                    trigger,
                    job_key,
                    execution_id,
                    now() - begun,
                    fence=held.fence,
                )
                await self._claim(job_key, version, execution_id, held.fence)
                ctx = JobContext(
                    held=held,
                    job_key=job_key,
                    execution_id=execution_id,
                    pod=self._pod,
                    trigger=trigger,
                    completer=completer,
                )
                result = await self._job.run(ctx)
                if completer is not None and not completer.called:
                    await completer.complete(result)  # still under the lease
        except LeaseBusy as exc:
            self._finished(trigger, job_key, execution_id, begun, held, "busy")
            return Ending("busy"), exc.retry_after
        except LeaseUnavailable as exc:
            # The acquire got no answer: nothing ran, ownership was never confirmed.
            self._finished(trigger, job_key, execution_id, begun, held, "lost", error=exc)
            return Ending("lost"), None
        except anyio.get_cancelled_exc_class():
            self._finished(trigger, job_key, execution_id, begun, held, "cancelled")
            raise
        except _Unclaimed as exc:  # the job did not run
            self._finished(trigger, job_key, execution_id, begun, held, exc.ending)
            return exc.ending, None
        except Exception as exc:
            if completer is not None and completer.result is not None:
                # The store answered: its durable answer decides, whatever happened after.
                ending = self._judged(trigger, job_key, execution_id, completer, completer.result)
                self._finished(trigger, job_key, execution_id, begun, held, ending, error=exc)
                return ending, None
            ending = losses.charge(Ending.of_error(held.outcome or "failed", exc, held.loss_reason))
            if isinstance(exc, StoreUnavailable) and held.outcome is None:
                ending = Ending("lost", reason="store_unavailable")  # a commit failed: retried
            self._finished(trigger, job_key, execution_id, begun, held, ending, error=exc)
            return ending, None
        ending = Ending("completed")
        if completer is not None and completer.result is not None:
            ending = self._judged(trigger, job_key, execution_id, completer, completer.result)
        self._finished(trigger, job_key, execution_id, begun, held, ending, result=result)
        return ending, None

    async def _claim(self, job_key: str, version: str, execution_id: str, fence: int) -> None:
        """Show this execution's fence to the store before the job runs; raise if it must not.

        Until the store has seen the new fence, a former holder paused past its
        lease could still complete, and win. The claim makes every lower fence
        ``stale`` from now on, whether or not this execution ever completes.
        """
        if self._store is None:
            return
        try:
            answer = await self._store.claim(self._key(job_key), version, fence)
        except StoreUnavailable as exc:
            logger.warning(
                "%s; job %r does not start unfenced, retried",
                exc,
                job_key,
                extra={
                    "event": "claim_unavailable",
                    "jobId": job_key,
                    "executionId": execution_id,
                    "pod": self._pod,
                },
            )
            raise _Unclaimed(Ending("lost", reason="store_unavailable")) from exc
        if answer.status == "duplicate":
            raise _Unclaimed(Ending("duplicate"))
        if answer.status == "stale":
            logger.warning(
                "claim of %r refused as stale: fence %d < highest fence %d; not retried",
                job_key,
                fence,
                answer.highest_fence,
                extra={
                    "event": "claim_stale",
                    "jobId": job_key,
                    "executionId": execution_id,
                    "pod": self._pod,
                    "fence": fence,
                    "winningFence": answer.highest_fence,
                },
            )
            raise _Unclaimed(Ending("lost", reason="stale"))

    def _completer(
        self, held: HeldLease, job_key: str, version: str, execution_id: str
    ) -> Completer | None:
        if self._store is None:
            return None
        return Completer(
            self._store,
            held,
            key=self._key(job_key),
            input_version=version,
            execution_id=execution_id,
            pod=self._pod,
            max_result_bytes=self._max_result_bytes,
        )

    def _judged(
        self,
        trigger: Trigger,
        job_key: str,
        execution_id: str,
        completer: Completer,
        answer: CompletionResult,
    ) -> Ending:
        """Report the store's answer (a ``completion`` event) and map it onto an ending."""
        self._emit(
            "completion",
            trigger,
            job_key,
            execution_id,
            completer.elapsed,
            fence=answer.fence,
            reason=answer.status,
        )
        if completer.own(answer):
            return Ending("completed")
        if answer.status == "duplicate":
            return Ending("duplicate")
        logger.warning(
            "completion of %r refused as stale: fence %d < winning fence %d; not retried",
            job_key,
            answer.fence,
            answer.winning_fence,
            extra={
                "event": "completion_stale",
                "jobId": job_key,
                "executionId": execution_id,
                "pod": self._pod,
                "fence": answer.fence,
                "winningFence": answer.winning_fence,
            },
        )
        return Ending("lost", reason="stale")

    def _finished(
        self,
        trigger: Trigger,
        job_key: str,
        execution_id: str,
        begun: float,
        held: HeldLease,
        outcome: Outcome | Ending,
        *,
        error: BaseException | None = None,
        result: object = None,
    ) -> None:
        ending = outcome if isinstance(outcome, Ending) else Ending(outcome)
        self._emit(
            "finished",
            trigger,
            job_key,
            execution_id,
            now() - begun,
            outcome=ending.outcome,
            reason=ending.reason,
            fence=_fence_of(held),
            error=error,
            result=result,
        )

    def _emit(
        self,
        name: EventName,
        trigger: Trigger,
        job_key: str,
        execution_id: str,
        elapsed: float,
        *,
        outcome: Outcome | None = None,
        reason: str | None = None,
        fence: int | None = None,
        retry_in: float | None = None,
        error: BaseException | None = None,
        result: object = None,
    ) -> None:
        event = ExecutionEvent(
            event=name,
            job_key=job_key,
            execution_id=execution_id,
            pod=self._pod,
            trigger=trigger,
            elapsed=elapsed,
            outcome=outcome,
            reason=reason,
            fence=fence,
            retry_in=retry_in,
            error=error,
            result=result,
        )
        try:
            self._observer.on_event(event)
        except Exception:  # an observer's bug must not change the job's outcome
            logger.exception("execution observer failed on %s", name)

    def _lease_observer(
        self, trigger: Trigger, job_key: str, execution_id: str
    ) -> LeaseObserver | None:
        """Return this execution's lease observer (telemetry), if there is a factory."""
        if self._lease_observers is None:
            return None
        try:
            return self._lease_observers(trigger, job_key, execution_id)
        except Exception:  # telemetry's bug must not stop the execution
            logger.exception("lease observer factory failed")
            return None


def _fence_of(held: HeldLease) -> int | None:
    """Return the execution's fence, or ``None`` when it never acquired the lease."""
    try:
        return held.fence
    except RuntimeError:
        return None
