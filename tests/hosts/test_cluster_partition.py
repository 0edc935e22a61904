"""A Redis Cluster master cut from the majority while a client still reaches it.

Six hosts on one bridge, one cluster node each (three shards of a master and
a replica). A holds a lease through ``hold()`` with ``replicas=1`` from this
process, which reaches every host. The master of the key's shard is then cut
from the other five nodes: the two other masters fail it and promote its
replica, while the cut master, alone, still answers A. A's renewals there
reach no replica (``WAIT`` counts 0) and, once it counts itself in the
minority, are refused outright; either way A's body is stopped. The
partition heals, the old master rejoins as the new one's replica, and B, a
client made then, gets the key only once A's replicated lease expired.

Guaranteed, and tested: A's body ended before B's acquire was sent, and B's
fence is above A's.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import anyio
import pytest
from redis.asyncio.cluster import RedisCluster

from leaseworker import Lease, RedisLeases
from leaseworker_dev._services import Hosts, LocalRedisCluster, RedisNode

from .partitioned import Holder, acquire_when_free, cut_from_the_rest


@pytest.fixture(scope="module")
def cluster(hosts: Hosts) -> Iterator[LocalRedisCluster]:
    """A six-node cluster whose nodes each run on a host of their own."""
    places = [hosts.add(f"node{index}").place for index in range(6)]
    started = LocalRedisCluster.start(places=places)
    try:
        yield started
    finally:
        started.stop()


@pytest.mark.timeout(180)
async def test_a_master_cut_from_the_majority_stops_its_holder_before_the_new_master_grants(
    hosts: Hosts, cluster: LocalRedisCluster
) -> None:
    """A is lost and stopped before B's acquire on the promoted replica; B's fence is above A's."""
    await cluster.settle()
    a = Holder()
    a_client = RedisCluster(startup_nodes=cluster.startup_nodes())
    a_leases = RedisLeases(
        a_client,
        namespace=f"t{uuid.uuid4().hex[:8]}",
        command_timeout=2.0,
        replicas=1,
    )
    key = "partitioned"
    shard = await cluster.shard_of(a_leases.lease_key(key))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(a.hold, a_leases, key, lambda: anyio.sleep(120))
            await a.entered()
            old = await cluster.shard_master(shard)
            try:
                cut_from_the_rest(hosts, old.address[0], [n.address[0] for n in cluster.nodes])
                with anyio.fail_after(60):
                    while a.error is None:  # noqa: ASYNC110 - A's renewals end it, not an event
                        await anyio.sleep(0.05)
                replica = next(n for n in cluster.shard_nodes(shard) if n is not old)
                await anyio.to_thread.run_sync(_promoted, replica)
                role = await anyio.to_thread.run_sync(old.role)
                assert role[0] == "master"  # alone, it still answers A as a master
            finally:
                hosts.heal()
            await cluster.settle()  # the old master rejoins as the replica: B's WAIT can count it
            lease = await _acquire_as_b(cluster, a_leases.namespace, key)
            tg.cancel_scope.cancel()  # an A still running at this point is the failure
    finally:
        await a_leases.aclose()
        await a_client.aclose()
    a.stopped_before(lease)


def _promoted(replica: RedisNode) -> None:
    """Return once the majority promoted ``replica`` (it says master), or raise after 60 s."""
    deadline = time.monotonic() + 60
    while replica.role()[0] != "master":
        if time.monotonic() > deadline:
            raise TimeoutError(f"{replica.name} was not promoted within 60 s")
        time.sleep(0.05)


async def _acquire_as_b(cluster: LocalRedisCluster, namespace: str, key: str) -> Lease:
    """Acquire with a client made after the heal, every 50 ms until free; release it."""
    client = RedisCluster(startup_nodes=cluster.startup_nodes())
    b = RedisLeases(client, namespace=namespace, command_timeout=2.0, replicas=1)
    try:
        lease = await acquire_when_free(b, key)
        await b.release(lease)
        return lease
    finally:
        await b.aclose()
        await client.aclose()
