"""A pod on a three-broker Kafka (RF 3, min.insync.replicas 2) while brokers die and restart.

One cluster for the module; each test leaves all three nodes running and in
sync. The pod runs in this process with gated jobs, so the fault lands while
triggers are in flight: whatever moves (a partition's leader, the group
coordinator), every trigger completes once, redeliveries are answered
``duplicate`` by the store, and every offset gets committed.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import anyio
import pytest
from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]
from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

from leaseworker_dev._services import LocalKafkaCluster, LocalRedis

from ..jobs import GateJob, Recorder, on_topic
from ..kafka_util import KafkaNames, StoreAnswers, committed, end_offset, payload, produce
from ..waiting import eventually
from ..worker_util import cluster_pod_config, make_worker, running


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalKafkaCluster]:
    """Three KRaft nodes, broker and controller each."""
    nodes = LocalKafkaCluster.start()
    yield nodes
    nodes.stop()


@pytest.fixture
def restored(cluster: LocalKafkaCluster) -> LocalKafkaCluster:
    """The cluster with every node up and in sync, restored before the test that needs it.

    Not after each test: the module's last test leaves two nodes down, and
    restarting them only to stop them cost two JVM starts (about 12 s).
    """
    cluster.up(*[i for i, node in cluster.nodes.items() if node.process.popen.poll() is not None])
    cluster.wait_in_sync()
    return cluster


async def _consume_through(
    fault: str,
    cluster: LocalKafkaCluster,
    redis: LocalRedis,
    names: KafkaNames,
    namespace: str,
) -> StoreAnswers:
    """Run a pod on gated triggers, play ``fault`` mid-run, produce more; wait for all.

    ``fault``: ``leader`` or ``coordinator`` (that node is killed, SIGKILL)
    or ``rolling`` (each node restarted in turn, triggers produced meanwhile).
    Returns once every trigger's offset is committed.
    """
    bootstrap = cluster.bootstrap_servers
    cluster.create_topics([names.topic])
    recorder, answers = Recorder(), StoreAnswers()
    job = on_topic(GateJob, names.topic)(recorder)
    config = cluster_pod_config(cluster, redis, names, namespace)
    gated = [(f"k{i}".encode(), payload(gate=True)) for i in range(8)]
    await produce(bootstrap, names.topic, gated)
    produced, keys = len(gated), len(gated)
    async with running(make_worker(job, config, hooks=[answers])):
        await recorder.until(lambda: sum(recorder.running.values()) == config.concurrency)
        if fault == "rolling":
            restarted = anyio.Event()

            async def restart() -> None:
                await anyio.to_thread.run_sync(cluster.rolling_restart, abandon_on_cancel=True)
                restarted.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(restart)
                produced += await _open_and_resend(recorder, bootstrap, names.topic, gated)
                while not restarted.is_set():  # a trigger at a time all through the restart
                    key, keys, produced = f"k{keys}", keys + 1, produced + 1
                    await produce(bootstrap, names.topic, [(key.encode(), payload())])
                    await recorder.until(functools.partial(_done, recorder, key), within=60)
        else:
            victim = (
                cluster.leader(names.topic)
                if fault == "leader"
                else cluster.coordinator(names.group)
            )
            cluster.kill(victim)
            produced += await _open_and_resend(recorder, bootstrap, names.topic, gated)
            more = [(f"k{i}".encode(), payload()) for i in range(keys, keys + 4)]
            await produce(bootstrap, names.topic, more)
            produced, keys = produced + len(more), keys + len(more)

        async def all_committed() -> bool:
            # Up to the log's end, which may pass the sends: a send whose leader moved
            # before it answered can be in the log and be sent again (the producer is not
            # idempotent), and both copies are triggers the pod consumes and commits.
            end = await end_offset(bootstrap, names.topic)
            return end >= produced and await committed(bootstrap, names.group, names.topic) == {
                0: end
            }

        await eventually(all_committed, within=60)
    assert set(answers.answers) == {f"k{i}" for i in range(keys)}
    assert recorder.overlaps == 0
    return answers


def _done(recorder: Recorder, key: str) -> bool:
    return recorder.done(key) >= 1


async def _open_and_resend(
    recorder: Recorder, bootstrap: str, topic: str, gated: list[tuple[bytes, bytes]]
) -> int:
    """Let the gated jobs finish and send their triggers again; return how many were sent.

    A producer whose acknowledgements a dying leader never sent retries the
    same records: these are such redeliveries, answered ``duplicate``.
    """
    for key, _ in gated:
        recorder.gate(key.decode()).set()
    await produce(bootstrap, topic, gated)
    return len(gated)


def _each_completed_once(answers: StoreAnswers) -> None:
    """Every key: one accepted completion; the resent ones' redeliveries were duplicates."""
    for key, statuses in answers.answers.items():
        assert statuses.count("accepted") == 1, (key, statuses)
        assert set(statuses) <= {"accepted", "duplicate"}, (key, statuses)
        outcomes = answers.outcomes[key]
        assert outcomes.count("completed") == 1, (key, outcomes)
        assert set(outcomes) <= {"completed", "duplicate", "busy"}, (key, outcomes)
    for i in range(8):  # the resent triggers
        assert "duplicate" in answers.outcomes[f"k{i}"], answers.outcomes[f"k{i}"]


@pytest.mark.parametrize("victim", ["leader", "coordinator"])
async def test_a_killed_broker_loses_no_trigger_and_completes_each_once(
    restored: LocalKafkaCluster,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    victim: str,
) -> None:
    """The node leading the topic's partition (or the group's coordinator) is SIGKILLed.

    Four gated jobs are running when it dies; the gates open, the eight gated
    triggers are sent again and four more are produced (acks=all: two of
    three brokers suffice). Every trigger completes once, every offset is
    committed.
    """
    with anyio.fail_after(120):
        answers = await _consume_through(victim, restored, redis_server, kafka_names, namespace)
    _each_completed_once(answers)


async def test_a_rolling_restart_of_all_three_loses_no_trigger(
    restored: LocalKafkaCluster,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
) -> None:
    """Each node restarts in turn; meanwhile a trigger at a time is produced and completed."""
    with anyio.fail_after(180):
        answers = await _consume_through("rolling", restored, redis_server, kafka_names, namespace)
    _each_completed_once(answers)


async def test_acks_all_refuses_with_two_of_three_brokers_down(
    restored: LocalKafkaCluster, kafka_names: KafkaNames
) -> None:
    """The leader alone takes an acks=1 write, never an acks=all one.

    With two nodes down the controllers have no quorum either, so the ISR
    cannot shrink below min.insync.replicas=2: the acks=all send waits for a
    follower that never comes, and times out.
    """
    restored.create_topics([kafka_names.topic])
    leader = restored.leader(kafka_names.topic)
    for node_id in restored.nodes:
        if node_id != leader:
            restored.kill(node_id)
    with anyio.fail_after(60):
        assert await _send(restored.bootstrap_servers, kafka_names.topic, acks=1) >= 0
        with pytest.raises(KafkaError):
            await _send(restored.bootstrap_servers, kafka_names.topic, acks="all")


async def _send(bootstrap: str, topic: str, *, acks: int | str) -> int:
    """Send one record with ``acks``, giving up after 3 s; return its offset."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=acks, request_timeout_ms=3000)
    await producer.start()
    try:
        meta = await producer.send_and_wait(topic, value=b"{}", key=b"k")
        return int(meta.offset)
    finally:
        await producer.stop()
