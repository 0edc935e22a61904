"""Executions: run one trigger's job under its lease until a terminal outcome.

One *execution* is one attempt: acquire the lease, run the job inside
``hold()``, end with an outcome. A trigger may need several: when another pod
holds the lease (``busy``) the executor waits with the job's capped, jittered
:class:`BusyPolicy` (shortened to the holder's remaining TTL, so it takes over
soon after an expiry) and tries again; when ownership could not be confirmed
(``lost``: Redis down, a renewal failed) it backs off and tries again, so work
resumes when Redis returns. Only ``completed``, ``failed`` and ``timed_out``
end a trigger. Cancellation (shutdown, rebalance) propagates after it is
reported. This layer knows nothing about Kafka.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import final

import anyio

from ._backoff import BusyPolicy
from ._errors import LeaseBusy, LeaseUnavailable
from ._hold import HeldLease, Outcome, hold
from ._job import JobContext, ReportJob
from ._lease import LeaseStore
from ._lease_events import LeaseObserver
from ._observer import TERMINAL, EventName, ExecutionEvent, ExecutionObserver
from ._trigger import Trigger

logger = logging.getLogger("leaseworker.execution")

LOST_RETRY = BusyPolicy(initial=0.5, cap=5.0)
"""Backoff after an execution could not confirm its lease (Redis slow or down)."""

LeaseObservers = Callable[[Trigger, str, str], LeaseObserver]
"""Return the lease observer of one execution, given (trigger, job key, execution id)."""


@final
class Executor:
    """Run triggers of one job class against one lease store, one trigger per call.

    ::

        executor = Executor(MonthlyReport(), RedisLeases(redis), pod="pod-1",
                            observer=LoggingObserver())
        outcome = await executor.run(trigger, "report:acme:2026-11")  # completed/failed/timed_out

    Construction checks the job's lease settings (:class:`ConfigError`).
    The caller serialises calls for one job key within a pod; across pods the
    lease does it.
    """

    def __init__(
        self,
        job: ReportJob,
        leases: LeaseStore,
        *,
        pod: str,
        observer: ExecutionObserver,
        lost_retry: BusyPolicy = LOST_RETRY,
        lease_observers: LeaseObservers | None = None,
    ) -> None:
        self._job = job
        self._leases = leases
        self._timing = job.lease_timing(leases.policy)
        self._pod = pod
        self._observer = observer
        self._lost_retry = lost_retry
        self._lease_observers = lease_observers

    async def run(self, trigger: Trigger, job_key: str) -> Outcome:
        """Run executions of ``job_key`` until one reaches a terminal outcome; return it."""
        retries = {"busy": 0, "lost": 0}
        while True:
            execution_id = uuid.uuid4().hex
            outcome, hint = await self._execute(trigger, job_key, execution_id)
            if outcome in TERMINAL:
                return outcome
            policy = self._job.busy_policy if outcome == "busy" else self._lost_retry
            kind = "busy" if outcome == "busy" else "lost"
            delay = policy.delay(retries[kind], hint)
            retries[kind] += 1
            self._emit("retry", trigger, job_key, execution_id, 0.0, retry_in=delay)
            await anyio.sleep(delay)

    async def _execute(
        self, trigger: Trigger, job_key: str, execution_id: str
    ) -> tuple[Outcome, float | None]:
        """One execution; return its outcome and, when busy, the holder's remaining TTL."""
        held = hold(
            self._leases,
            job_key,
            ttl=self._timing.ttl,
            renew_every=self._timing.renew_every,
            max_runtime=self._timing.max_runtime,
            observer=self._lease_observer(trigger, job_key, execution_id),
        )
        begun = anyio.current_time()
        result: object = None
        try:
            async with held:
                self._emit(
                    "started",
                    trigger,
                    job_key,
                    execution_id,
                    anyio.current_time() - begun,
                    fence=held.fence,
                )
                ctx = JobContext(
                    held=held,
                    job_key=job_key,
                    execution_id=execution_id,
                    pod=self._pod,
                    trigger=trigger,
                )
                result = await self._job.run(ctx)
        except LeaseBusy as exc:
            self._finished(trigger, job_key, execution_id, begun, held, "busy")
            return "busy", exc.retry_after
        except LeaseUnavailable as exc:
            # The acquire got no answer: nothing ran, ownership was never confirmed.
            self._finished(trigger, job_key, execution_id, begun, held, "lost", error=exc)
            return "lost", None
        except anyio.get_cancelled_exc_class():
            self._finished(trigger, job_key, execution_id, begun, held, "cancelled")
            raise
        except Exception as exc:
            outcome = held.outcome or "failed"
            self._finished(trigger, job_key, execution_id, begun, held, outcome, error=exc)
            return outcome, None
        self._finished(trigger, job_key, execution_id, begun, held, "completed", result=result)
        return "completed", None

    def _finished(
        self,
        trigger: Trigger,
        job_key: str,
        execution_id: str,
        begun: float,
        held: HeldLease,
        outcome: Outcome,
        *,
        error: BaseException | None = None,
        result: object = None,
    ) -> None:
        self._emit(
            "finished",
            trigger,
            job_key,
            execution_id,
            anyio.current_time() - begun,
            outcome=outcome,
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
