"""Running in-process worker pods against the session's Kafka and Redis."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio

from leaseworker import Event, Pod, PodConfig, ReportJob
from leaseworker_dev._services import LocalKafka, LocalKafkaCluster, LocalRedis

from .kafka_util import KafkaNames


def pod_config(
    kafka: LocalKafka, redis: LocalRedis, names: KafkaNames, namespace: str, **overrides: Any
) -> PodConfig:
    """Short Kafka timings so rebalances and failovers take seconds, not minutes."""
    settings: dict[str, Any] = {
        "bootstrap_servers": kafka.bootstrap_servers,
        "redis_url": redis.url,
        "group": names.group,
        "pod": "pod-a",
        "namespace": namespace,
        "concurrency": 4,
        "shutdown_timeout": 5.0,
        "session_timeout": 6.0,
        "heartbeat_interval": 1.0,
        "revoke_timeout": 2.0,
        "commit_timeout": 3.0,
        "kafka_timeout": 15.0,
        "poll_timeout": 0.1,
        "startup_retry_cap": 0.5,
        # Each in-process worker its own store: no file left in the working directory.
        "store_url": "sqlite:///:memory:",
    }
    settings.update(overrides)
    return PodConfig(**settings)


def cluster_pod_config(
    cluster: LocalKafkaCluster,
    redis: LocalRedis,
    names: KafkaNames,
    namespace: str,
    **overrides: Any,
) -> PodConfig:
    """:func:`pod_config` whose pod bootstraps from every broker of ``cluster``."""
    first = next(iter(cluster.nodes.values()))
    overrides.setdefault("bootstrap_servers", cluster.bootstrap_servers)
    return pod_config(first, redis, names, namespace, **overrides)


@contextlib.asynccontextmanager
async def running(worker: Pod) -> AsyncIterator[Pod]:
    """Run ``worker`` until the block ends; then stop it and wait for its drain."""
    async with anyio.create_task_group() as tg:
        await tg.start(_run, worker)
        try:
            yield worker
        finally:
            worker.stop()


async def _run(worker: Pod, *, task_status: anyio.abc.TaskStatus[None]) -> None:
    await worker.run(task_status=task_status)


async def until(check: Callable[[], bool], *, within: float = 20) -> None:
    """Wait until in-process state without an event of its own satisfies ``check``.

    Log records, an exporter's spans. For the source's stats give the worker
    (or the source) a :class:`Progress` hook: it wakes on every event instead
    of polling.
    """
    with anyio.fail_after(within):
        while not check():  # noqa: ASYNC110 - such state has no event to wait on
            await anyio.sleep(0.02)


class Progress:
    """A hook that wakes :meth:`until` at every event: tests wait for stats through it."""

    def __init__(self) -> None:
        self._moved: anyio.Event | None = None

    def __call__(self, event: Event) -> None:
        """Wake the waiter, if any: something the stats count may have changed."""
        moved, self._moved = self._moved, None
        if moved is not None:
            moved.set()

    async def until(self, check: Callable[[], bool], *, timeout: float) -> None:  # noqa: ASYNC109 - a test's wait is bounded
        """Return once ``check()`` holds, re-checked at every event (``TimeoutError``: too late)."""
        with anyio.fail_after(timeout):
            while not check():
                if self._moved is None:
                    self._moved = anyio.Event()
                await self._moved.wait()


def make_worker(job: ReportJob, config: PodConfig, **kwargs: Any) -> Pod:
    """Build a worker (a seam for tests that need a custom lease store)."""
    return Pod(job, config, **kwargs)
