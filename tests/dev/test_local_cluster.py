"""LocalRedisCluster: six real nodes in three shards that fail over and move slots on request."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import AskError, MovedError

from leaseworker_dev._services import LocalRedisCluster
from leaseworker_dev._services._cluster import SHARDS, slot_of

from ..topologies import assert_gone, command, direct, replicas_acknowledging, role


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRedisCluster]:
    """One cluster for the module: it starts in ~3 s."""
    cluster = LocalRedisCluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
async def settled(cluster: LocalRedisCluster) -> LocalRedisCluster:
    """The cluster, healthy again whatever the previous test failed over or killed."""
    await cluster.settle()
    return cluster


@pytest.fixture
async def client(settled: LocalRedisCluster) -> AsyncIterator[RedisCluster]:
    """A cluster-mode client, as an application would hold one."""
    client = RedisCluster(startup_nodes=settled.startup_nodes())
    try:
        yield client
    finally:
        await client.aclose()


async def keys_per_shard(cluster: LocalRedisCluster, prefix: str) -> list[str]:
    """One key for each shard, in shard order."""
    found: dict[int, str] = {}
    for number in itertools.count():
        name = f"{prefix}{number}"
        found.setdefault(await cluster.shard_of(name), name)
        if len(found) == SHARDS:
            return [found[shard] for shard in range(SHARDS)]
    raise AssertionError("unreachable")


async def test_a_key_on_each_shard_is_on_that_shards_master_and_replica(
    settled: LocalRedisCluster, client: RedisCluster
) -> None:
    """The cluster client routes each key to its shard; the shard's replica has it after WAIT."""
    for shard, name in enumerate(await keys_per_shard(settled, "each")):
        await client.set(name, f"v{shard}")
        master = await settled.shard_master(shard)
        (replica,) = (node for node in settled.shard_nodes(shard) if node is not master)
        async with direct(master) as raw:
            assert await raw.get(name) == f"v{shard}".encode()
            assert await replicas_acknowledging(raw, 1, 5000) == 1
        async with direct(replica, single_connection=True) as raw:
            await command(raw, "READONLY")
            assert await raw.get(name) == f"v{shard}".encode()


async def test_failover_of_a_shard_swaps_its_master_and_replica(
    settled: LocalRedisCluster, client: RedisCluster
) -> None:
    """After failover(shard) the replica serves the shard and the old master replicates it."""
    name = (await keys_per_shard(settled, "fo"))[0]
    await client.set(name, "before")
    old = await settled.shard_master(0)
    new = await settled.failover(0)
    assert new is not old
    assert await settled.shard_master(0) is new
    async with direct(old) as raw:
        assert await role(raw) == (b"slave", new.port)
    assert await client.get(name) == b"before"  # the client follows the MOVED
    await client.set(name, "after")
    async with direct(new) as raw:
        assert await raw.get(name) == b"after"


async def test_kill_master_of_a_shard_promotes_its_replica(
    settled: LocalRedisCluster, client: RedisCluster
) -> None:
    """A SIGKILLed shard master is replaced by its replica, which has the acknowledged write.

    settle() then restarts the dead node, which rejoins as the shard's replica.
    """
    name = (await keys_per_shard(settled, "kill"))[1]
    await client.set(name, "v")
    old = await settled.shard_master(1)
    async with direct(old) as raw:
        assert await replicas_acknowledging(raw, 1, 5000) == 1
    new = await settled.kill_master(1)
    assert not old.alive
    assert new is not old
    assert await settled.shard_master(1) is new
    async with RedisCluster(startup_nodes=settled.startup_nodes()) as fresh:
        assert await fresh.get(name) == b"v"
    await settled.settle()
    async with direct(old) as raw:
        assert await role(raw) == (b"slave", new.port)


async def test_a_write_after_cut_off_is_lost_when_the_shard_master_dies(
    settled: LocalRedisCluster, client: RedisCluster
) -> None:
    """A write the cut-off replica never saw is gone once the shard master dies.

    The promoted replica serves the shard with the earlier, acknowledged write only.
    """
    kept = (await keys_per_shard(settled, "lost"))[2]
    shard = await settled.shard_of(kept)
    lost = f"{{{kept}}}:after"  # same hash tag, same slot, same shard
    await client.set(kept, "v")
    master = await settled.shard_master(shard)
    async with direct(master) as raw:
        assert await replicas_acknowledging(raw, 1, 5000) == 1
    replica = await settled.cut_off(shard)
    async with direct(master) as raw:
        await raw.set(lost, "v")
        assert await replicas_acknowledging(raw, 1, 100) == 0
    settled.kill(master)
    settled.resume(replica)
    assert await settled.wait_for_promotion(shard) is replica
    async with direct(replica) as raw:
        assert await raw.get(kept) == b"v"
        assert await raw.get(lost) is None


async def test_migrate_slot_moves_the_keys_and_redirects_with_ask_then_moved(
    settled: LocalRedisCluster, client: RedisCluster
) -> None:
    """Mid-migration the old owner answers ASK for a moved key; once finished, MOVED.

    The new owner serves the key throughout, and the cluster client follows both.
    """
    name = (await keys_per_shard(settled, "mig"))[2]
    slot = slot_of(name)
    await client.set(name, "v")
    source = await settled.shard_master(2)
    target = await settled.shard_master(0)

    await settled.migrate_slot(slot, target, finish=False)
    async with direct(source) as raw:
        with pytest.raises(AskError):
            await raw.get(name)
    async with direct(target, single_connection=True) as raw:
        with pytest.raises(MovedError):  # without ASKING the importing node redirects back
            await raw.get(name)
        await command(raw, "ASKING")
        assert await raw.get(name) == b"v"
    assert await client.get(name) == b"v"

    await settled.finish_slot_migration(slot)
    assert await settled.slot_owner(slot) is target
    async with direct(source) as raw:
        with pytest.raises(MovedError):
            await raw.get(name)
    async with direct(target) as raw:
        assert await raw.get(name) == b"v"
    assert await client.get(name) == b"v"
    assert await settled.shard_of(name) == 0


async def test_stop_leaves_no_process_and_no_work_dir() -> None:
    """After stop() no node's PID exists and the work dir with the cluster config files is gone."""
    cluster = LocalRedisCluster.start()
    try:
        configs = [node.argv[-1] for node in cluster.nodes]
        assert all(config.startswith(str(cluster.workdir)) for config in configs)
        assert len(list(cluster.workdir.glob("node*/nodes.conf"))) == len(cluster.nodes)
        pids = [node.pid for node in cluster.nodes]
        assert cluster.url == "redis+cluster://" + ",".join(
            f"127.0.0.1:{node.port}" for node in cluster.nodes
        )
    finally:
        cluster.stop()
    assert_gone(pids, cluster.workdir)
