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

import math
import time
import uuid
from collections.abc import Iterator

import anyio
import pytest
from redis.asyncio.cluster import RedisCluster

from leaseworker import Lease, LeaseLost, LeaseUnavailable, RedisLeases, hold
from leaseworker._lease import now
from leaseworker_dev._services import Hosts, LocalRedisCluster, RedisNode

LEASE = 4.0


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
    a_stopped, a_fence, a_error = math.inf, 0, None
    a_in = anyio.Event()
    a_client = RedisCluster(startup_nodes=cluster.startup_nodes())
    a = RedisLeases(
        a_client,
        namespace=f"t{uuid.uuid4().hex[:8]}",
        command_timeout=2.0,
        replicas=1,
    )
    key = "partitioned"
    shard = await cluster.shard_of(a.lease_key(key))

    async def hold_a() -> None:
        nonlocal a_stopped, a_fence, a_error
        try:
            async with hold(a, key, lease_duration=LEASE, renewal_interval=LEASE / 4) as held:
                a_fence = held.fence
                a_in.set()
                try:
                    await anyio.sleep(120)
                finally:
                    a_stopped = now()
        except Exception as exc:  # lost: stopped, as measured
            a_error = exc
        finally:
            a_in.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold_a)
            with anyio.fail_after(30):
                await a_in.wait()
            assert a_error is None, a_error
            old = await cluster.shard_master(shard)
            cut_off = hosts.at(old.address[0])
            try:
                for node in cluster.nodes:
                    if node is not old:
                        hosts.cut(cut_off, hosts.at(node.address[0]))
                with anyio.fail_after(60):
                    while a_error is None:  # noqa: ASYNC110 - A's renewals end it, not an event
                        await anyio.sleep(0.05)
                replica = next(n for n in cluster.shard_nodes(shard) if n is not old)
                await anyio.to_thread.run_sync(_promoted, replica)
                role = await anyio.to_thread.run_sync(old.role)
                assert role[0] == "master"  # alone, it still answers A as a master
            finally:
                hosts.heal()
            await cluster.settle()  # the old master rejoins as the replica: B's WAIT can count it
            lease: Lease = await _acquire_as_b(cluster, a.namespace, key)
            tg.cancel_scope.cancel()  # an A still running at this point is the failure
    finally:
        await a.aclose()
        await a_client.aclose()
    print(f"A: {a_error!r}; B acquired {lease.sent_at - a_stopped:.3f}s after A stopped")
    assert isinstance(a_error, LeaseLost), a_error
    assert a_error.reason == "unreplicated", a_error  # WAIT's 1 s, not the 2 s call's timeout
    assert a_stopped < lease.sent_at, f"A ran {a_stopped - lease.sent_at:.3f}s after B's acquire"
    assert lease.fence > a_fence


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
        with anyio.fail_after(3 * LEASE + 30):
            while True:
                try:
                    lease = await b.acquire(key, LEASE)
                except LeaseUnavailable:  # the shard is still switching
                    lease = None
                if lease is not None:
                    await b.release(lease)
                    return lease
                await anyio.sleep(0.05)
    finally:
        await b.aclose()
        await client.aclose()
