"""The pytest plugin's embedded pods: a job class run as a pod inside the test's event loop.

Imported by the ``leaseworker_pod`` fixture when a test asks for it, so that
loading the plugin costs a pytest session nothing (this module brings in the
worker and aiokafka).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, final

import anyio

from leaseworker.toolkit import (
    DEAD_LETTER_SUFFIX,
    Event,
    ExecutionEvent,
    JobResult,
    Pod,
    PodConfig,
    ProcessPool,
    ReportJob,
    SourceEvent,
    ended,
    execution_step,
    now,
    send_trigger,
)

if TYPE_CHECKING:
    from ._services import LocalKafka, LocalRedis


@final
class PodFactory:
    """Builds :class:`EmbeddedPod` s on the fixtures' Kafka topic and Redis.

    ``factory(JobClass, *args, **kwargs)`` runs a pod of a subclass of
    ``JobClass`` whose ``topic`` is the test's topic (the class's own attributes
    and ``job_key()`` otherwise unchanged), built with ``args``/``kwargs``;
    ``config`` overrides :class:`~leaseworker.PodConfig` fields.
    """

    def __init__(self, kafka: LocalKafka, redis: LocalRedis, topic: str) -> None:
        self.kafka = kafka
        self.redis = redis
        self.topic = topic
        self._namespace = f"t{uuid.uuid4().hex[:12]}"

    @contextlib.asynccontextmanager
    async def __call__(
        self,
        job_class: type[ReportJob],
        *args: Any,
        config: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[EmbeddedPod]:
        """Run a pod of ``job_class(*args, **kwargs)`` on the test's topic while the block runs."""
        on_topic = type(job_class.__name__, (job_class,), {"topic": self.topic})
        job = on_topic(*args, **kwargs)
        pod = EmbeddedPod(job, self._config(config or {}), self.kafka.bootstrap_servers)
        async with anyio.create_task_group() as tg:
            await tg.start(pod.run)
            try:
                yield pod
            finally:
                pod.worker.stop()

    def _config(self, overrides: Mapping[str, Any]) -> PodConfig:
        settings: dict[str, Any] = {
            "bootstrap_servers": self.kafka.bootstrap_servers,
            "redis_url": self.redis.url,
            "group": f"group-{self.topic}",
            "pod": "test-pod",
            "namespace": self._namespace,
            "dead_letter_topic": self.topic + DEAD_LETTER_SUFFIX,
            "store_url": "sqlite:///:memory:",
            "shutdown_timeout": 5.0,
            "session_timeout": 6.0,
            "heartbeat_interval": 1.0,
            "poll_timeout": 0.1,
            "startup_retry_cap": 0.5,
            **overrides,
        }
        return PodConfig(**settings)


@final
class EmbeddedPod:
    """A pod running one job class in the test's event loop; :meth:`send` waits for the outcome.

    Unlike ``leaseworker run``, its ``run_in_process`` pool (``process_workers``)
    starts on the job's first call, not with the pod: a test whose job never
    calls it starts no process; the first call waits for the workers' start.
    """

    def __init__(self, job: ReportJob, config: PodConfig, bootstrap_servers: str) -> None:
        self.job = job
        self.config = config
        self._bootstrap = bootstrap_servers
        self._events: dict[tuple[int, int], list[tuple[float, ExecutionEvent]]] = {}
        self._began = now()
        self._ended: dict[tuple[int, int], anyio.Event] = {}
        self._malformed: set[tuple[int, int]] = set()
        self._processes = ProcessPool(
            config.process_workers,
            max_tasks_per_child=config.max_tasks_per_child,
            max_memory_per_child=config.max_memory_per_child,
        )
        self.worker = Pod(job, config, hooks=(self,), processes=self._processes)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """Run the worker until stopped (``task_status``: once Kafka is connected)."""
        try:
            await self.worker.run(task_status=task_status)
        finally:
            with anyio.CancelScope(shield=True):
                await self._processes.aclose()  # started by a call, if any: none left after

    async def send(
        self,
        payload: Mapping[str, Any],
        *,
        key: str | None = None,
        within: float = 60.0,
    ) -> JobResult:
        """Produce one trigger and wait until the pod ends it; return how it ended.

        The result is a :class:`~leaseworker.testing.JobResult` whose events are
        the trigger's execution events (``at``: seconds since the pod started;
        checkpoints are not counted in a pod). Raises ``TimeoutError`` after
        ``within`` seconds, and ``AssertionError`` when the pod dead-letters
        the record as malformed instead of running it.
        """
        partition, offset = await send_trigger(
            self.config.bootstrap_servers,
            self.job.topic,
            key=key,
            payload=dict(payload),
            security=self.config.kafka_security,  # a pod on a secured listener sends through it
        )
        ended = self._ended.setdefault((partition, offset), anyio.Event())
        with anyio.fail_after(within):
            await ended.wait()
        if (partition, offset) in self._malformed:
            raise AssertionError(f"the pod dead-lettered record {offset} as malformed")
        return self._result(self._events[(partition, offset)])

    def __call__(self, event: Event) -> None:
        """Keep the pod's execution events; a malformed record ends its wait too (the hook)."""
        if isinstance(event, ExecutionEvent) and event.event != "acquiring":
            self.on_event(event)
        elif isinstance(event, SourceEvent) and event.name == "malformed":
            where = (event.record.partition, event.record.offset)
            self._malformed.add(where)
            self._ended.setdefault(where, anyio.Event()).set()

    def on_event(self, event: ExecutionEvent) -> None:
        """Keep the event under its record; a terminal ``finished`` ends the wait."""
        where = (event.trigger.partition, event.trigger.offset)
        self._events.setdefault(where, []).append((now() - self._began, event))
        if event.event == "finished" and event.terminal:
            self._ended.setdefault(where, anyio.Event()).set()

    def _result(self, timed: list[tuple[float, ExecutionEvent]]) -> JobResult:
        events = [event for _, event in timed]
        finished = [event for event in events if event.event == "finished"]
        completions = [event.reason for event in events if event.event == "completion"]
        steps = tuple(execution_step(event, at=at) for at, event in timed)
        return ended(
            finished[-1].job_key,
            finished[-1],
            completion=completions[-1] if completions else None,
            executions=len(finished),
            events=steps,
        )
