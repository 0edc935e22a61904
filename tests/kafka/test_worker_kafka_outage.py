"""The worker pod when Kafka goes away: pauses after reassignment, a broker restart mid-run."""

from __future__ import annotations

import collections
import functools
import logging
import time
from typing import Any

import anyio
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition  # type: ignore[import-untyped]
from aiokafka.client import AIOKafkaClient  # type: ignore[import-untyped]

from leaseworker import PodConfig
from leaseworker._execution import Ending
from leaseworker._kafka import KafkaTriggerSource
from leaseworker._kafka._quiet import quiet
from leaseworker._worker import TriggerWay
from leaseworker_dev._services import LocalKafka, LocalRedis

from ..fake_kafka import FakeConsumer, Handled
from ..jobs import GateJob, Recorder, on_topic
from ..kafka_util import KafkaNames, committed, payload, produce
from ..waiting import eventually
from ..worker_util import Progress, make_worker, pod_config, running, until


async def test_aiokafka_forgets_pause_flags_when_partitions_are_reassigned(
    kafka_server: LocalKafka, kafka_names: KafkaNames
) -> None:
    """The premise of re-pausing: after a rebalance a paused partition is no longer paused.

    If a later aiokafka kept pause flags across assignments this would fail,
    and the source's re-pausing in its assignment callback could go.
    """
    kafka_server.create_topics([kafka_names.topic], partitions=2)
    first = _consumer(kafka_server, kafka_names)
    second = _consumer(kafka_server, kafka_names)
    with anyio.fail_after(40):
        await first.start()
        try:
            await _poll_until(first, lambda: len(first.assignment()) == 2)
            first.pause(*first.assignment())
            assert set(first.paused()) == set(first.assignment())
            await second.start()
            try:
                await _poll_until(
                    first, lambda: len(first.assignment()) == 1, also=second
                )  # the rebalance gave one partition to the second member
                assert set(first.paused()) == set()
            finally:
                await second.stop()
        finally:
            await first.stop()


@pytest.mark.fake
@pytest.mark.parametrize("why", ["at the concurrency limit", "stopping"])
async def test_the_assignment_callback_pauses_new_partitions_at_once_when_full_or_stopping(
    why: str,
) -> None:
    """A pod at its limit (or draining) pauses newly assigned partitions in the callback.

    Waiting for the next poll-loop turn would let the first fetch after the
    rebalance hand out records the pod has no room for.
    """
    release = anyio.Event()

    async def handle(trigger: object, key: str) -> Ending:
        await release.wait()
        return Ending("completed")

    config = PodConfig(concurrency=2)
    consumer, progress = FakeConsumer(), Progress()
    source = KafkaTriggerSource(
        config,
        topic="t",
        resolve_key=lambda t: "k",
        consumer_factory=consumer.factory,
        hooks=[progress],
    )
    first, new = TopicPartition("t", 0), {TopicPartition("t", 0), TopicPartition("t", 1)}
    busy = 1 if why == "stopping" else config.concurrency
    consumer.add(first, busy)
    async with anyio.create_task_group() as tg:
        await tg.start(TriggerWay(source, Handled(handle)).run)
        await consumer.assign({first})
        await progress.until(lambda: source.stats.in_flight == busy, timeout=5)
        if why == "stopping":
            source.stop()
        await consumer.assign(new)
        assert consumer.paused() == new
        release.set()
        if why != "stopping":
            await progress.until(lambda: source.stats.in_flight == 0, timeout=5)
            await consumer.assign(new)
            assert consumer.paused() == set()  # room again: the partitions are resumed
            source.stop()
    assert consumer.commits[-1] == {first: busy}


async def test_a_broker_restart_mid_run_loses_no_trigger_and_commits_only_finished_work(
    own_kafka: LocalKafka, redis_server: LocalRedis, kafka_names: KafkaNames, namespace: str
) -> None:
    """Kafka stops and comes back on the same port while a pod runs.

    The job that finishes during the outage is committed once Kafka is back;
    the pod resumes and runs triggers produced afterwards; while an earlier
    trigger is unfinished its offset and every later one stay uncommitted;
    every trigger completes, and no key ever runs twice at once.
    """
    bootstrap = own_kafka.bootstrap_servers
    own_kafka.create_topics([kafka_names.topic])
    recorder = Recorder()
    job = on_topic(GateJob, kafka_names.topic)(recorder)
    config = pod_config(own_kafka, redis_server, kafka_names, namespace, commit_timeout=2.0)
    await produce(bootstrap, kafka_names.topic, [(b"a", payload()), (b"b", payload(gate=True))])
    progress = Progress()
    async with running(make_worker(job, config, hooks=[progress])) as worker:
        await recorder.until(lambda: recorder.done("a") == 1 and bool(recorder.runs_of("b")))
        await eventually(_committed_is(own_kafka, kafka_names, {0: 1}), within=10)
        old_broker = own_kafka.process
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                functools.partial(
                    anyio.to_thread.run_sync, own_kafka.restart, abandon_on_cancel=True
                ),
            )
            await until(lambda: old_broker.popen.poll() is not None, within=30)
            recorder.gate("b").set()  # b finishes while the broker is down
            await recorder.until(lambda: recorder.done("b") >= 1)
        # The broker is back: b's offset gets committed, new triggers run.
        await eventually(_committed_is(own_kafka, kafka_names, {0: 2}), within=40)
        await produce(bootstrap, kafka_names.topic, [(b"c", payload(gate=True)), (b"d", payload())])
        await recorder.until(lambda: recorder.done("d") >= 1, within=30)
        # The committer has looked since d finished: a commit past c's gap would be made.
        await progress.until(
            lambda: worker.stats.commit_checked >= worker.stats.finished >= 3, timeout=20
        )
        assert await committed(bootstrap, kafka_names.group, kafka_names.topic) == {0: 2}
        recorder.gate("c").set()
        await eventually(_committed_is(own_kafka, kafka_names, {0: 4}), within=20)
    assert all(recorder.done(key) >= 1 for key in "abcd")
    assert recorder.overlaps == 0


def _committed_is(kafka: LocalKafka, names: KafkaNames, expected: dict[int, int]) -> Any:
    async def check() -> bool:
        try:
            return await committed(kafka.bootstrap_servers, names.group, names.topic) == expected
        except Exception:  # the admin client's own errors while the coordinator settles
            return False

    return check


def _consumer(kafka: LocalKafka, names: KafkaNames) -> Any:
    return AIOKafkaConsumer(
        names.topic,
        bootstrap_servers=kafka.bootstrap_servers,
        group_id=names.group,
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
    )


async def _poll_until(consumer: Any, check: Any, *, also: Any = None) -> None:
    """Keep the group members polling (that is what drives a rebalance) until ``check()``."""
    while not check():
        await consumer.getmany(timeout_ms=100)
        if also is not None:
            await also.getmany(timeout_ms=100)


@pytest.mark.fake
async def test_a_hook_wakes_on_the_sources_progress_and_its_wait_is_bounded() -> None:
    """A waiter on the stats returns once the source moved there, and times out otherwise."""
    release = anyio.Event()

    async def handle(trigger: object, key: str) -> Ending:
        await release.wait()
        return Ending("completed")

    consumer, progress = FakeConsumer(), Progress()
    source = KafkaTriggerSource(
        PodConfig(),
        topic="t",
        resolve_key=lambda t: "k",
        consumer_factory=consumer.factory,
        hooks=[progress],
    )
    partition = TopicPartition("t", 0)
    async with anyio.create_task_group() as tg:
        await tg.start(TriggerWay(source, Handled(handle)).run)
        await consumer.assign({partition})
        consumer.add(partition, 1)
        await progress.until(lambda: source.stats.in_flight == 1, timeout=5)
        with pytest.raises(TimeoutError):
            await progress.until(lambda: source.stats.finished == 1, timeout=0.05)
        release.set()
        await progress.until(lambda: source.stats.finished == 1, timeout=5)
        await progress.until(lambda: source.stats.commits == 1, timeout=5)
        source.stop()
    assert consumer.commits == [{partition: 1}]


OUTAGE = 4.0
"""Seconds the broker stays down in the quiet-outage test (a restart under load takes 4-6 s)."""


class FailingGateJob(GateJob):
    """A GateJob that raises after its gate when the payload says ``"fail": true``."""

    async def run(self, ctx: Any) -> object:
        """Run as GateJob does, then fail if told to (its trigger is dead-lettered)."""
        result = await super().run(ctx)
        if ctx.trigger.payload.get("fail"):
            raise RuntimeError("asked to fail")
        return result


async def test_a_broker_outage_under_load_is_logged_in_a_few_lines_and_does_not_spin(
    own_kafka: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """While the broker is down, a busy pod logs a few lines and stays nearly idle.

    Jobs are running (renewing their leases), one finishes (its commit fails)
    and one fails (its dead letter cannot be sent) during the outage. aiokafka
    alone forces a metadata refresh on every fetcher and sender pass while a
    partition has no known leader, each refused at once: thousands of
    "Unable to update metadata" / "Unable connect to node" pairs a second and
    a core spinning. The pod must stay within a few lines a second and a
    fraction of a core; after the outage every trigger completes and is
    committed.
    """
    caplog.set_level(logging.INFO)
    own_kafka.create_topics([kafka_names.topic, kafka_names.dead_letters], partitions=2)
    recorder = Recorder()
    job = on_topic(FailingGateJob, kafka_names.topic)(recorder)
    config = pod_config(
        own_kafka,
        redis_server,
        kafka_names,
        namespace,
        commit_timeout=2.0,
        dead_letter_topic=kafka_names.dead_letters,
    )
    triggers = [(key.encode(), payload(gate=True, fail=key == "f")) for key in "abcf"]
    await produce(own_kafka.bootstrap_servers, kafka_names.topic, triggers)
    async with running(make_worker(job, config)) as worker:
        await recorder.until(lambda: all(recorder.runs_of(key) for key in "abcf"))
        await anyio.to_thread.run_sync(own_kafka.down)
        began, cpu_before = len(caplog.records), time.process_time()
        recorder.gate("a").set()  # finishes during the outage: its commit cannot be made
        recorder.gate("f").set()  # fails during the outage: its dead letter cannot be sent
        await anyio.sleep(OUTAGE)  # the outage itself: the broker is down this long
        cpu = time.process_time() - cpu_before
        lines = caplog.records[began:]
        await anyio.to_thread.run_sync(own_kafka.up)
        recorder.gate("b").set()
        recorder.gate("c").set()
        await eventually(_all_committed(own_kafka, kafka_names, len(triggers)), within=60)
        assert worker.stats.dead_letters == 1
    # The executions' own lines (a finishing, f failing) are the load, not the outage's.
    noise = [r for r in lines if r.name != "leaseworker.execution"]
    summary = collections.Counter(f"{r.levelname} {r.name}: {r.msg}" for r in noise)
    assert len(noise) <= OUTAGE * 3, summary.most_common(5)  # unpatched: about 250
    assert cpu < OUTAGE * 0.25, f"{cpu:.2f}s of CPU in a {OUTAGE}s outage"


def _all_committed(kafka: LocalKafka, names: KafkaNames, count: int) -> Any:
    async def check() -> bool:
        try:
            offsets = await committed(kafka.bootstrap_servers, names.group, names.topic)
        except Exception:  # the admin client's own errors while the coordinator settles
            return False
        return sum(offsets.values()) == count

    return check


async def test_a_failed_metadata_refresh_backs_off_instead_of_spinning(
    own_kafka: LocalKafka, caplog: pytest.LogCaptureFixture
) -> None:
    """The spinning path, driven as aiokafka's fetcher and sender drive it with no leader known.

    Each pass forces a metadata refresh and waits for it. With every broker
    refusing connections, aiokafka's own client answers each at once (the
    premise: if a later aiokafka backs off itself, the first count drops and
    ``back_off_metadata`` can go); the patched client answers after a backoff,
    so passes, log lines and CPU stay small. While the broker answers, the
    patched client refreshes at most every 0.1 s (a broker that is back but
    has not elected leaders yet answers every refresh with no leader).
    """
    caplog.set_level(logging.INFO)
    plain = AIOKafkaClient(bootstrap_servers=own_kafka.bootstrap_servers)
    patched = AIOKafkaClient(bootstrap_servers=own_kafka.bootstrap_servers)
    quiet(patched)
    try:
        await plain.bootstrap()
        await patched.bootstrap()
        # Up, answering: the refreshes are spaced (a broker electing leaders answers too).
        answered_plain, _ = await _refresh_passes(plain, seconds=1.0)
        answered_patched, _ = await _refresh_passes(patched, seconds=0.5)
        await anyio.to_thread.run_sync(own_kafka.down)
        plain_passes, _ = await _refresh_passes(plain, seconds=1.0)
        began = len(caplog.records)
        patched_passes, cpu = await _refresh_passes(patched, seconds=2.0)
        lines = len(caplog.records) - began
    finally:
        await plain.close()
        await patched.close()
        await anyio.to_thread.run_sync(own_kafka.up)
    # one broker round trip each: three times the patched pace at least (10 a second); the
    # premise is the spacing, not the machine's speed (beside three CPU hogs, 48 in 1 s)
    assert answered_plain > 30
    assert answered_patched <= 6  # 0.1 s apart
    assert plain_passes > 200  # aiokafka alone: a busy loop
    assert patched_passes <= 15  # a 0.2-1 s backoff: about 5 in 2 s
    assert lines <= 4, [record.getMessage() for record in caplog.records[began:]]
    assert cpu < 0.5


async def _refresh_passes(client: Any, *, seconds: float) -> tuple[int, float]:
    """Force and await metadata refreshes for ``seconds``; return the passes and CPU seconds."""
    passes, cpu = 0, time.process_time()
    with anyio.move_on_after(seconds):
        while True:
            await client.force_metadata_update()
            passes += 1
    return passes, time.process_time() - cpu
