"""The worker pod when things move: long jobs, rebalances, Redis and Kafka going away."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from aiokafka import TopicPartition  # type: ignore[import-untyped]
from aiokafka.errors import (  # type: ignore[import-untyped]
    CommitFailedError,
    IllegalStateError,
    NotCoordinatorForGroupError,
)
from redis.asyncio import Redis

from leaseworker import Event, ExecutionEvent, PodConfig
from leaseworker._kafka import Partition, SourceStats
from leaseworker._kafka._commits import Commits
from leaseworker._kafka._state import SourceState
from leaseworker.testing import ChaosProxy
from leaseworker_dev._services import LocalKafka, LocalRedis, free_port

from ..chaos import proxied_leases
from ..jobs import GateJob, Recorder, on_topic
from ..kafka_util import KafkaNames, committed, payload, produce
from ..waiting import eventually
from ..worker_util import Progress, make_worker, pod_config, running, until


def _committed_is(kafka: LocalKafka, names: KafkaNames, expected: dict[int, int]):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return await committed(kafka.bootstrap_servers, names.group, names.topic) == expected

    return check


async def test_a_job_longer_than_max_poll_interval_keeps_the_pod_in_the_group(
    kafka_server: LocalKafka, redis_server: LocalRedis, kafka_names: KafkaNames, namespace: str
) -> None:
    """A 4.5 s job with max_poll_interval=1.5 s: no eviction, partitions paused at the limit."""
    kafka_server.create_topics([kafka_names.topic])
    recorder = Recorder()
    job = on_topic(GateJob, kafka_names.topic)(recorder)
    config = pod_config(
        kafka_server, redis_server, kafka_names, namespace, concurrency=1, max_poll_interval=1.5
    )
    records = [(b"long", payload(seconds=4.5)), (b"next", payload())]
    await produce(kafka_server.bootstrap_servers, kafka_names.topic, records)
    progress = Progress()
    async with running(make_worker(job, config, hooks=[progress])) as worker:
        await recorder.until(lambda: bool(recorder.runs_of("long")))
        await progress.until(lambda: worker.stats.paused, timeout=20)
        assert recorder.runs_of("next") == []  # at the limit: the second trigger waits
        await recorder.until(lambda: recorder.done("next") == 1, within=15)
        await eventually(_committed_is(kafka_server, kafka_names, {0: 2}), within=10)
        stats = dataclasses.replace(worker.stats)  # before shutdown leaves the group
    assert (stats.assignments, stats.revocations, stats.ownership_losses) == (1, 0, 0)
    assert stats.commit_errors == 0
    assert recorder.runs_of("next")[0].started >= recorder.runs_of("long")[0].stopped  # type: ignore[operator]


async def test_rebalance_stops_in_flight_work_commits_the_prefix_then_hands_over(
    kafka_server: LocalKafka, redis_server: LocalRedis, kafka_names: KafkaNames, namespace: str
) -> None:
    """A second pod joins: in-flight work is stopped, the prefix committed, then handed over.

    The first pod stops its stuck execution after revoke_timeout, commits the
    completed prefix before giving the partition up, and the job re-runs only
    after the old execution released its lease (higher fence, no overlap).
    """
    kafka_server.create_topics([kafka_names.topic])
    recorder = Recorder()
    job_class = on_topic(GateJob, kafka_names.topic)
    config_a = pod_config(kafka_server, redis_server, kafka_names, namespace, revoke_timeout=1.0)
    config_b = pod_config(kafka_server, redis_server, kafka_names, namespace, pod="pod-b")
    records = [(b"quick", payload()), (b"stuck", payload(gate=True))]
    await produce(kafka_server.bootstrap_servers, kafka_names.topic, records)
    async with running(make_worker(job_class(recorder), config_a)) as first:
        await recorder.until(
            lambda: recorder.done("quick") == 1 and bool(recorder.runs_of("stuck"))
        )
        async with running(make_worker(job_class(recorder), config_b)):
            await recorder.until(lambda: recorder.done("stuck", "cancelled") == 1, within=15)
            assert first.stats.cancelled_on_revoke == 1
            await eventually(_committed_is(kafka_server, kafka_names, {0: 1}), within=10)
            recorder.gate("stuck").set()
            await recorder.until(lambda: recorder.done("stuck") == 1, within=15)
            await eventually(_committed_is(kafka_server, kafka_names, {0: 2}), within=10)
    old, new = recorder.runs_of("stuck")
    assert old.stopped is not None
    assert new.started >= old.stopped
    assert new.fence > old.fence
    assert first.stats.revocations >= 1


async def test_redis_outage_mid_run_stops_the_job_keeps_the_trigger_and_resumes(
    kafka_server: LocalKafka, redis_server: LocalRedis, kafka_names: KafkaNames, namespace: str
) -> None:
    """Black-holed Redis: the job is stopped (lost), nothing is committed; it completes after."""
    kafka_server.create_topics([kafka_names.topic])
    recorder = Recorder()
    job = on_topic(GateJob, kafka_names.topic, lease_duration=3.0)(recorder)
    config = pod_config(kafka_server, redis_server, kafka_names, namespace)
    await produce(kafka_server.bootstrap_servers, kafka_names.topic, [(b"k", payload(gate=True))])
    retries: list[ExecutionEvent] = []
    observer = _OnEvent(retries.append, only="retry")
    async with (
        # 1 s per call: the blackhole still stops the job within 2 s (a renewal interval
        # plus the timeout), and no call through the proxy times out on a loaded machine.
        proxied_leases(redis_server, namespace, command_timeout=1.0) as (proxy, leases),
        running(make_worker(job, config, leases=leases, hooks=[observer])) as worker,
    ):
        await recorder.until(lambda: bool(recorder.runs_of("k")))
        proxy.blackhole = True
        await recorder.until(lambda: recorder.done("k", "lost") == 1, within=5)
        # The executor chose to run "k" again: its record is still in flight.
        await until(lambda: bool(retries))
        assert worker.stats.finished == 0
        assert (
            await committed(kafka_server.bootstrap_servers, kafka_names.group, kafka_names.topic)
            == {}
        )
        recorder.gate("k").set()
        proxy.blackhole = False
        await recorder.until(lambda: recorder.done("k") == 1, within=20)
        await eventually(_committed_is(kafka_server, kafka_names, {0: 1}), within=10)


async def test_redis_and_kafka_down_at_start_are_retried_with_a_log_line(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Start-up waits for Redis, then Kafka, logging each retry, and then works normally."""
    kafka_server.create_topics([kafka_names.topic])
    caplog.set_level(logging.INFO, logger="leaseworker")
    recorder = Recorder()
    job = on_topic(GateJob, kafka_names.topic)(recorder)
    async with (
        ChaosProxy(redis_server.port) as redis_proxy,
        ChaosProxy(kafka_server.port) as kafka_proxy,
    ):
        redis_proxy.refuse = kafka_proxy.refuse = True
        config = pod_config(
            kafka_server,
            redis_server,
            kafka_names,
            namespace,
            redis_url=f"redis://:secret-password@127.0.0.1:{redis_proxy.port}/0",
            bootstrap_servers=f"127.0.0.1:{kafka_proxy.port}",
        )

        def logged(event: str) -> int:
            return sum(1 for r in caplog.records if getattr(r, "event", "") == event)

        worker = make_worker(job, config)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await until(lambda: logged("redis_unavailable") >= 2)
            assert logged("kafka_unavailable") == 0  # Kafka is not tried before Redis answers
            redis_proxy.refuse = False
            await until(lambda: logged("kafka_unavailable") >= 2, within=30)
            kafka_proxy.refuse = False
            await produce(kafka_server.bootstrap_servers, kafka_names.topic, [(b"k", payload())])
            await recorder.until(lambda: recorder.done("k") == 1, within=30)
            worker.stop()
    assert "secret-password" not in caplog.text
    assert logged("redis_connected") == 1
    assert logged("kafka_connected") >= 1


@pytest.mark.parametrize("down", ["redis", "kafka", "store"])
async def test_stop_while_a_service_is_down_at_start_returns_at_once(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
    down: str,
) -> None:
    """SIGTERM during a start-up outage: the pod stops instead of waiting for the service.

    Before, the start-up retry loops did not look at stop(): a pod told to stop
    while Redis, Kafka or its store was down ran until the service came back
    (here: never) or it was killed.
    """
    caplog.set_level(logging.INFO, logger="leaseworker")
    dead = f"127.0.0.1:{free_port()}"
    overrides = {
        "redis": {"redis_url": f"redis://{dead}/0"},
        "kafka": {"bootstrap_servers": dead},
        "store": {"store_url": f"postgresql://leaseworker:pw@{dead}/reports"},
    }[down]
    config = pod_config(
        kafka_server,
        redis_server,
        kafka_names,
        namespace,
        startup_retry_cap=30.0,
        store_timeout=1.0,
        **overrides,
    )
    worker = make_worker(on_topic(GateJob, kafka_names.topic)(Recorder()), config)

    def retried() -> bool:
        return any(getattr(r, "event", "") == f"{down}_unavailable" for r in caplog.records)

    returned = anyio.Event()
    async with anyio.create_task_group() as tg:

        async def run() -> None:
            await tg.start(worker.run)  # a stop before start-up ended must not fail this
            returned.set()

        tg.start_soon(run)
        await until(retried)  # it failed once and is waiting to try again
        worker.stop()
        with anyio.fail_after(5):  # the outage never ends by itself
            await returned.wait()


class _OnEvent:
    """An ExecutionObserver that calls ``handle`` for every event named ``only``."""

    def __init__(self, handle: Callable[[ExecutionEvent], object], *, only: str) -> None:
        self.handle = handle
        self.only = only

    def __call__(self, event: Event) -> None:
        """Pass ``event`` on if it has the name."""
        if not isinstance(event, ExecutionEvent) or event.event == "acquiring":
            return
        if event.event == self.only:
            self.handle(event)


def _committer(consumer: Any, config: PodConfig | None = None) -> tuple[Commits, SourceStats]:
    """A source's committer, committing through ``consumer`` (a stand-in: fake tests only)."""
    state = SourceState()
    return Commits(state, config or PodConfig(), consumer.commit), state.stats


def _finished_partition(partition: int) -> Partition:
    """Partition ``partition`` of topic ``t`` with offset 0 finished: offset 1 is committable."""
    part = Partition(TopicPartition("t", partition))
    part.tracker.add(0)
    part.tracker.done(0)
    return part


class _RejectingConsumer:
    """A stand-in consumer whose commits fail as after a rebalance (fake)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def commit(self, offsets: object) -> None:
        raise self.error


@pytest.mark.fake
@pytest.mark.parametrize("error", [CommitFailedError("gen"), IllegalStateError("unassigned")])
async def test_a_rejected_commit_is_recorded_as_lost_ownership_not_a_crash(
    error: Exception,
) -> None:
    """CommitFailedError/IllegalStateError: counted, partition marked gone, no exception."""
    commits, stats = _committer(_RejectingConsumer(error))
    part = _finished_partition(0)
    await commits.commit([part])
    assert stats.ownership_losses == 1
    assert part.gone
    assert stats.commits == 0


class _FlakyConsumer:
    """A stand-in consumer whose first commit fails as a moving coordinator's would (fake)."""

    def __init__(self) -> None:
        self.calls = 0

    async def commit(self, offsets: object) -> None:
        self.calls += 1
        if self.calls == 1:
            raise NotCoordinatorForGroupError("the coordinator moved")


@pytest.mark.fake
async def test_the_last_commit_of_a_partition_is_retried_within_commit_timeout() -> None:
    """A revoked or shut-down partition has no later commit: a failed one is tried again.

    Before, the commit at a rebalance or at shutdown was tried once: a
    coordinator moving at that moment sent the finished work to be run again.
    """
    consumer = _FlakyConsumer()
    commits, stats = _committer(consumer, PodConfig(poll_timeout=0.05, commit_timeout=2.0))
    part = _finished_partition(0)
    await commits.last([part])
    assert consumer.calls == 2
    assert (stats.commit_errors, stats.commits) == (1, 1)
    assert part.tracker.committable() is None


class _HangingConsumer:
    """A stand-in consumer whose commits never answer (fake)."""

    def __init__(self) -> None:
        self.committing = anyio.Event()

    async def commit(self, offsets: object) -> None:
        self.committing.set()
        await anyio.sleep_forever()


@pytest.mark.fake
async def test_waiting_for_a_commit_in_flight_counts_against_commit_timeout() -> None:
    """The revoke step's commit waits for the background one within its own bound.

    ``rebalance_timeout`` has room for one ``commit_timeout``; waiting for the
    commit lock used to come on top of it, so a revoke could take twice as
    long and the group would drop the pod mid-rebalance.
    """
    consumer = _HangingConsumer()
    commit_timeout = 0.5
    config = PodConfig(poll_timeout=0.05, commit_timeout=commit_timeout)
    commits, stats = _committer(consumer, config)
    background, revoked = _finished_partition(0), _finished_partition(1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(commits.commit, [background])  # holds the lock until it times out
        await consumer.committing.wait()
        began = anyio.current_time()
        await commits.last([revoked])
        took = anyio.current_time() - began
    assert took < commit_timeout + 0.3  # not two commit timeouts
    assert stats.commits == 0


@pytest.mark.parametrize(("policy", "warned"), [("volatile-lru", True), ("noeviction", False)])
async def test_a_redis_that_may_evict_lease_keys_is_warned_about_at_start(
    kafka_server: LocalKafka,
    kafka_names: KafkaNames,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
    policy: str,
    warned: bool,
) -> None:
    """An evicting maxmemory policy gets one warning at start; ``noeviction`` is quiet.

    An evicted lease key lets another pod start while the owner still runs.
    """
    caplog.set_level(logging.INFO, logger="leaseworker")
    kafka_server.create_topics([kafka_names.topic])
    redis_server = LocalRedis.start()  # its own: the session's server keeps its settings
    try:
        client = Redis.from_url(redis_server.url)
        await client.config_set("maxmemory", "100mb")
        await client.config_set("maxmemory-policy", policy)
        await client.aclose()
        config = pod_config(kafka_server, redis_server, kafka_names, namespace)
        async with running(make_worker(on_topic(GateJob, kafka_names.topic)(Recorder()), config)):
            pass
    finally:
        redis_server.stop()
    warnings = [r for r in caplog.records if getattr(r, "event", "") == "redis_eviction_policy"]
    assert len(warnings) == (1 if warned else 0)
