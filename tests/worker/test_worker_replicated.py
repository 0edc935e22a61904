"""Two pods on replicated Redis and real Kafka: a failover loses no trigger, overlaps none.

The pods take their Redis from a ``redis+sentinel://`` or ``redis+cluster://``
URL, as ``leaseworker run --redis-url`` would (replica acknowledgement on by
default there). The master (Sentinel) or a shard (Cluster) fails over while
executions hold leases; every trigger still completes, and no two executions
of one job key ever ran at once (counted by the shared recorder from the jobs'
own start and stop).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from leaseworker import Pod
from leaseworker_dev._services import LocalKafka, LocalRedis, LocalRedisCluster, LocalSentinelGroup

from ..jobs import GateJob, Recorder, on_topic
from ..kafka_util import KafkaNames, committed, payload, produce
from ..waiting import eventually
from ..worker_util import pod_config, running


@dataclass(frozen=True)
class Topology:
    """A replicated Redis the pods use: its URL, and how to fail it over."""

    url: str
    failover: Callable[[], Awaitable[object]]
    keys: int  # enough job keys to spread over its shards


@pytest.fixture(
    params=[
        pytest.param(name, marks=pytest.mark.xdist_group(name)) for name in ("sentinel", "cluster")
    ]
)
async def topology(request: pytest.FixtureRequest) -> Topology:
    """The session's Sentinel group or cluster, healthy again (only the one asked is started)."""
    if request.param == "sentinel":
        group: LocalSentinelGroup = request.getfixturevalue("sentinel_group")
        await group.settle()
        return Topology(group.url, group.failover, keys=8)
    cluster: LocalRedisCluster = request.getfixturevalue("redis_cluster")
    await cluster.settle()
    return Topology(cluster.url, lambda: cluster.failover(0), keys=12)


@pytest.mark.timeout(180)
async def test_two_pods_complete_every_trigger_through_a_failover(
    topology: Topology,
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    tmp_path: Path,
) -> None:
    """SENTINEL FAILOVER / CLUSTER FAILOVER mid-run: every trigger completes and commits."""
    kafka_server.create_topics([kafka_names.topic], partitions=2)
    recorder = Recorder()
    job = on_topic(GateJob, kafka_names.topic, lease_duration=3.0)
    store = f"sqlite:///{tmp_path / 'completions.sqlite3'}"
    configs = [
        pod_config(
            kafka_server,
            redis_server,
            kafka_names,
            namespace,
            pod=pod,
            redis_url=topology.url,
            store_url=store,
            redis_timeout=1.0,
        )
        for pod in ("pod-a", "pod-b")
    ]
    assert all(config.replicas == 1 for config in configs)
    keys = [f"report:{i}" for i in range(topology.keys)]
    async with (
        running(Pod(job(recorder), configs[0])),
        running(Pod(job(recorder), configs[1])),
    ):
        await produce(
            kafka_server.bootstrap_servers,
            kafka_names.topic,
            [(key.encode(), payload(key, seconds=1.5)) for key in keys],
        )
        await recorder.until(lambda: len(recorder.runs) >= 2, within=60)
        await topology.failover()
        await recorder.until(lambda: all(recorder.done(key) >= 1 for key in keys), within=120)

        async def all_committed() -> bool:
            found = await committed(
                kafka_server.bootstrap_servers, kafka_names.group, kafka_names.topic
            )
            return sum(found.values()) == len(keys)

        await eventually(all_committed, within=60)
    assert recorder.overlaps == 0
    assert recorder.max_running >= 2  # the pods did run executions side by side
