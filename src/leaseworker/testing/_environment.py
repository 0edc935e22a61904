"""``JobEnvironment``: run a user's job on one trigger through the pod's executor, in memory.

The executor is the pod's own (store lookup, lease, claim, ``run(ctx)``,
completion, outcome), built once on :class:`MemoryLeases` and the
``memory://`` completion store; each run (``_one_run``) records every lifecycle
step on the loop's clock (it is the executor's hook) and applies its faults
through the public switches of the lease store and the completion store.
Nothing in the executor knows it is under test. See docs/testing.md.
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from typing import Any, final

from .._errors import MalformedTrigger
from .._execution import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Executor,
    ReportJob,
    Trigger,
    completion_key,
    resolve_job_key,
)
from .._lease import now
from .._process import ProcessPool
from .._store import Completion, MemoryStore
from ._clock import run_in_virtual_time
from ._committed import effects_mark, with_effects
from ._faulty_store import FaultyStore
from ._job_faults import Fault
from ._job_result import JobResult
from ._memory_leases import MemoryLeases
from ._one_run import Current, Run
from ._triggers import Headers, decode_record

TIME_LIMIT = 7 * 24 * 3600.0
"""The default ``time_limit``: a run that has not ended after a week of lease time fails."""


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
    at a time. ``ctx.run_in_process`` runs in real child processes
    (``processes``, default :meth:`~leaseworker.ProcessPool.default`); while
    one computes, virtual time runs at the real clock's pace, so a fault that
    loses the lease kills the child as in a pod.
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
        processes: ProcessPool | None = None,
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
        self._current = Current()
        # Built once, as a pod builds it: the job class is checked here (ConfigError).
        self._executor = Executor(
            job,
            self.leases,
            pod=pod,
            hooks=(self._current,),
            store=self._faulty,
            store_namespace=namespace,
            processes=processes,
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
        return await self._go(trigger, job_key, faults, work_per_checkpoint, retry)

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
            trigger, job_key = decode_record(
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
        # The job key decode_record resolved: job_key() runs once per record, as in a pod.
        return await self._go(trigger, job_key, faults, work_per_checkpoint, retry)

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

    async def _go(
        self,
        trigger: Trigger,
        job_key: str,
        faults: Sequence[Fault],
        work_per_checkpoint: float,
        retry: bool,
    ) -> JobResult:
        run = Run(
            executor=self._executor,
            leases=self.leases,
            store=self._faulty,
            lease_duration=self.job.lease_duration,
            time_limit=self.time_limit,
            trigger=trigger,
            job_key=job_key,
            faults=faults,
            work_per_checkpoint=work_per_checkpoint,
            retry=retry,
        )
        mark = effects_mark(self.store)
        return with_effects(await self._current.go(run), self.store, mark)

    async def _timed(self, run: Coroutine[Any, Any, JobResult]) -> JobResult:
        try:
            return await run
        finally:
            self._virtual_now = now()


def _malformed(exc: MalformedTrigger) -> JobResult:
    return JobResult(
        job_key=None, outcome=None, reason=exc.reason, dead_letter=exc.reason, detail=exc.detail
    )
