"""A broker cut from its two peers while a pod consumes and commits: it moves away, nothing is lost.

Three KRaft nodes (broker and controller each, RF 3, ``min.insync.replicas``
2), each on a host of its own, advertised at its host's address. The pod runs
in this process, which reaches every host: only the brokers are cut apart,
like a broker whose rack lost its links to the others but not to the clients.
The victim is the consumer group's coordinator, and it leads a partition of
the topic too (three partitions, one led by each node). Once four gated jobs
run, it is cut from both peers, both ways: the two others (a controller
quorum of 2 of 3) fence it and take over its leaderships and the coordinator,
while it still answers clients from its stale metadata. The gates open, the
gated triggers are sent again and more are produced: every key is completed
once, the resent ones are answered ``duplicate``, every offset is committed.
Healed, the victim catches up: every partition's ISR holds all three again.

Measured, not asserted (it is the client's and the broker's, not ours): the
cut node still answers metadata as the leader it was, and the pod's consumer
kept fetching its old partition there, so that partition's triggers sent
during the cut waited for the heal (in one run 2 of its 6 committed after 20 s
of cut, the other partitions all of theirs; all within a second of the heal),
and a producer bootstrapped from all three once timed out (30 s) on it: this
test's producer asks the peers only.

Runs in the ``own-kafka`` group: three JVMs are not started beside another
test's broker restarts.
"""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest
from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

from leaseworker_dev._services import NODE_IDS, Hosts, LocalKafkaCluster, LocalRedis

from ..jobs import GateJob, Recorder, on_topic
from ..kafka_util import KafkaNames, StoreAnswers, committed, payload, produce
from ..waiting import eventually
from ..worker_util import cluster_pod_config, make_worker, running

pytestmark = pytest.mark.xdist_group("own-kafka")

PARTITIONS = len(NODE_IDS)
"""One partition led by each node, so the cut node leads one."""


@pytest.fixture(scope="module")
def cluster(hosts: Hosts) -> Iterator[LocalKafkaCluster]:
    """Three KRaft nodes, each on a host of its own (``broker-<id>``)."""
    places = {node_id: hosts.add(f"broker-{node_id}").place for node_id in NODE_IDS}
    nodes = LocalKafkaCluster.start(places=places)
    yield nodes
    nodes.stop()


@pytest.mark.timeout(300)
async def test_a_broker_cut_from_its_peers_hands_over_and_rejoins(
    hosts: Hosts,
    cluster: LocalKafkaCluster,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
) -> None:
    """The coordinator, cut from both peers, loses it and its leaderships; healed, it rejoins."""
    bootstrap, topic, group = cluster.bootstrap_servers, kafka_names.topic, kafka_names.group
    cluster.create_topics([topic], partitions=PARTITIONS)
    recorder, answers = Recorder(), StoreAnswers()
    job = on_topic(GateJob, topic)(recorder)
    config = cluster_pod_config(
        cluster,
        redis_server,
        kafka_names,
        namespace,
        # Redis is not what this test cuts: 1.5 s per call (0.5 s ran out at load 12 and
        # lost an execution) still fits renewals of GateJob's 3 s lease.
        redis_timeout=1.5,
    )
    gated = [(f"k{i}".encode(), payload(gate=True)) for i in range(8)]
    more = [(f"k{i}".encode(), payload()) for i in range(8, 12)]
    await produce(bootstrap, topic, gated)
    produced = len(gated)
    async with running(make_worker(job, config, hooks=[answers])):
        await recorder.until(lambda: sum(recorder.running.values()) == config.concurrency)
        victim = await anyio.to_thread.run_sync(cluster.coordinator, group)
        peers = [node_id for node_id in NODE_IDS if node_id != victim]
        majority = ",".join(cluster.nodes[node_id].bootstrap_servers for node_id in peers)
        led = await anyio.to_thread.run_sync(cluster.leaders, topic)
        assert victim in led.values(), f"node {victim} coordinates but leads none of {led}"
        cut = hosts[f"broker-{victim}"]
        for peer in peers:
            hosts.cut(cut, hosts[f"broker-{peer}"])
        try:

            def moved_away() -> bool:
                """The peers' view: they lead every partition and coordinate the group."""
                try:
                    coordinator = cluster.coordinator(group, via=peers)
                    leaders = cluster.leaders(topic, via=peers)
                except (KafkaError, OSError, TimeoutError):  # asked mid-election
                    return False
                return coordinator in peers and set(leaders.values()) <= set(peers)

            await eventually(lambda: anyio.to_thread.run_sync(moved_away), within=60)
            for key, _ in gated:
                recorder.gate(key.decode()).set()
            # Sent through the peers: a producer that asks the cut node may wait on it.
            await produce(majority, topic, gated)  # a producer's retries: redeliveries
            await produce(majority, topic, more)
            produced += len(gated) + len(more)

            # The triggers fetched before the cut commit through the new coordinator.
            await eventually(lambda: _committed_at_least(majority, group, topic, 8), within=60)
            during = sum((await committed(majority, group, topic)).values())
        finally:
            hosts.heal()
        await eventually(lambda: _committed_at_least(majority, group, topic, produced), within=60)
    print(f"node {victim} cut: {during} of {produced} committed before the heal")
    await anyio.to_thread.run_sync(lambda: cluster.wait_in_sync(timeout=90))
    assert set(answers.answers) == {f"k{i}" for i in range(12)}
    assert recorder.overlaps == 0
    for name, statuses in answers.answers.items():
        assert statuses.count("accepted") == 1, (name, statuses)
        assert set(statuses) <= {"accepted", "duplicate"}, (name, statuses)
        outcomes = answers.outcomes[name]
        assert outcomes.count("completed") == 1, (name, outcomes)
        assert set(outcomes) <= {"completed", "duplicate", "busy"}, (name, outcomes)
    for key, _ in gated:
        assert "duplicate" in answers.outcomes[key.decode()], answers.outcomes[key.decode()]


async def _committed_at_least(bootstrap: str, group: str, topic: str, count: int) -> bool:
    """Whether ``group`` committed ``count`` records of ``topic``, asking ``bootstrap`` only."""
    return sum((await committed(bootstrap, group, topic)).values()) >= count
