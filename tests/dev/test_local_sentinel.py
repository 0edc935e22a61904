"""LocalSentinelGroup: a real master, replicas and sentinels that fail over on request."""

from __future__ import annotations

import uuid

import anyio
import pytest

from leaseworker_dev._services import FailoverAborted, LocalSentinelGroup, RedisNode

from ..topologies import (
    allow_promotion,
    assert_gone,
    direct,
    next_event,
    promotion_refused,
    replicas_acknowledging,
    role,
    sentinel_events,
)
from ..waiting import eventually

ABORTED = "-failover-abort-slave-timeout"
"""The event of a failover Sentinel gave up: its promotion did not show in time."""


@pytest.fixture
async def settled(sentinel_group: LocalSentinelGroup) -> LocalSentinelGroup:
    """The group, healthy again whatever the previous test failed over, killed or paused."""
    await sentinel_group.settle()
    return sentinel_group


def key() -> str:
    """A key of this test's own."""
    return f"t{uuid.uuid4().hex[:12]}"


async def test_a_write_on_the_master_is_read_on_every_replica(settled: LocalSentinelGroup) -> None:
    """The Sentinel client reaches the master; WAIT confirms both replicas, which serve the key."""
    roles = [role for _, role in await settled.roles()]
    assert sorted(roles) == ["master", "replica", "replica", "sentinel", "sentinel", "sentinel"]
    name = key()
    async with settled.master_client() as client:
        await client.set(name, "v")
        assert await replicas_acknowledging(client, 2, 5000) == 2
    master = await settled.master()
    for node in settled.servers:
        async with direct(node) as client:
            assert await client.get(name) == b"v"
            expected = (b"master", None) if node is master else (b"slave", master.port)
            assert await role(client) == expected


async def test_failover_promotes_a_replica_and_the_old_master_becomes_one(
    settled: LocalSentinelGroup,
) -> None:
    """After failover() the sentinels and the new master agree at once.

    The old master keeps running and Sentinel turns it into a replica of the new one.
    """
    old = await settled.master()
    name = key()
    async with settled.master_client() as client:
        await client.set(name, "before")
        assert await replicas_acknowledging(client, 2, 5000) == 2
    new = await settled.failover()
    assert new is not old
    assert await settled.master_address() == new.address
    async with direct(new) as client:
        assert await role(client) == (b"master", None)
        assert await client.get(name) == b"before"
    async with settled.master_client() as client:
        await client.set(name, "after")
    async with direct(new) as client:
        assert await client.get(name) == b"after"

    async def old_replicates_new() -> bool:
        async with direct(old) as client:
            return await role(client) == (b"slave", new.port)

    assert old.alive
    await eventually(old_replicates_new, within=30)  # Sentinel waits ~10 s before it acts


@pytest.mark.timeout(120)
async def test_a_failover_sentinel_aborts_is_requested_again(settled: LocalSentinelGroup) -> None:
    """Sentinel accepts SENTINEL FAILOVER, then aborts it; failover() asks again and succeeds.

    The replicas refuse the sentinels' SLAVEOF NO ONE (an ACL), so the first
    attempt aborts (``-failover-abort-slave-timeout``) with the old master
    still named. The test allows promotion again at that event: a later
    attempt promotes a replica, and failover() returns it.
    """
    old = await settled.master()
    replicas = [node for node in settled.servers if node is not old]
    promoted: list[RedisNode] = []

    async def fail_over() -> None:
        promoted.append(await settled.failover())

    async with (
        sentinel_events(settled.sentinels[0], ABORTED) as events,
        promotion_refused(replicas),
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(fail_over)
        assert await next_event(events) == ABORTED
        assert not promoted  # the abort did not end failover()
        await allow_promotion(replicas, allowed=True)
    [new] = promoted
    assert new in replicas
    assert await settled.master_address() == new.address
    async with direct(new) as client:
        assert await role(client) == (b"master", None)


@pytest.mark.timeout(120)
async def test_failover_gives_up_after_its_attempts_with_failover_aborted(
    settled: LocalSentinelGroup,
) -> None:
    """Every attempt aborted: FailoverAborted after exactly ``attempts`` aborts, old master kept.

    The group is left settled around the old master, each replica following it.
    """
    old = await settled.master()
    replicas = [node for node in settled.servers if node is not old]
    async with sentinel_events(settled.sentinels[0], ABORTED) as events:
        async with promotion_refused(replicas):
            with pytest.raises(FailoverAborted) as raised:
                await settled.failover(attempts=2)
        assert [await next_event(events), await next_event(events)] == [ABORTED, ABORTED]
    assert (raised.value.master, raised.value.attempts) == (old.name, 2)
    assert await settled.master() is old
    for node in replicas:
        async with direct(node) as client:
            assert await role(client) == (b"slave", old.port)


async def test_kill_master_promotes_a_replica_and_settle_brings_it_back(
    settled: LocalSentinelGroup,
) -> None:
    """A SIGKILLed master is replaced by a replica that has the acknowledged write.

    settle() then restarts the dead server as a replica of the new master.
    """
    old = await settled.master()
    name = key()
    async with settled.master_client() as client:
        await client.set(name, "v")
        assert await replicas_acknowledging(client, 2, 5000) == 2
    new = await settled.kill_master()
    assert not old.alive
    assert new is not old
    assert await settled.master_address() == new.address
    async with settled.master_client() as client:
        assert await client.get(name) == b"v"
    assert await settled.settle() is new
    roles = {node.name: role for node, role in await settled.roles()}
    assert roles[old.name] == "replica"


async def test_paused_replicas_hold_replication_back_until_resumed(
    settled: LocalSentinelGroup,
) -> None:
    """A write while every replica is SIGSTOPped reaches none (WAIT 1 100 is 0).

    Once resumed, the replicas catch up and serve it.
    """
    master = await settled.master()
    replicas = [node for node in settled.servers if node is not master]
    for node in replicas:
        settled.pause(node)
    name = key()
    try:
        assert {role for node, role in await settled.roles() if node in replicas} == {"paused"}
        async with direct(master) as client:
            await client.set(name, "v")
            assert await replicas_acknowledging(client, 1, 100) == 0
    finally:
        for node in replicas:
            settled.resume(node)
    async with direct(master) as client:
        assert await replicas_acknowledging(client, len(replicas), 5000) == len(replicas)
    for node in replicas:
        async with direct(node) as client:
            assert await client.get(name) == b"v"


async def test_a_write_after_cut_off_is_lost_when_the_master_dies(
    settled: LocalSentinelGroup,
) -> None:
    """Redis's documented failure: the master dies before replicating, a replica is promoted.

    A paused replica alone would still apply the write on resume (it waits in
    the socket buffer); cut off, the write is gone from the promoted replica.
    """
    master = await settled.master()
    replicas = [node for node in settled.servers if node is not master]
    kept, lost = key(), key()
    async with direct(master) as client:
        await client.set(kept, "v")
        assert await replicas_acknowledging(client, len(replicas), 5000) == len(replicas)
        for node in replicas:
            await settled.cut_off(node)
        await client.set(lost, "v")
        assert await replicas_acknowledging(client, 1, 100) == 0
    settled.kill(master)
    for node in replicas:
        settled.resume(node)
    new = await settled.wait_for_new_master(master)
    assert new in replicas
    async with direct(new) as client:
        assert await client.get(kept) == b"v"
        assert await client.get(lost) is None


async def test_stop_leaves_no_process_and_no_work_dir() -> None:
    """A group with one replica starts, serves, and after stop() no PID and no directory remains."""
    group = LocalSentinelGroup.start(replicas=1)
    try:
        assert len(group.servers) == 2
        ports = ",".join(f"127.0.0.1:{node.port}" for node in group.sentinels)
        assert group.url == f"redis+sentinel://{ports}/leaseworker"
        async with group.master_client() as client:
            await client.set("k", "v")
            assert await replicas_acknowledging(client, 1, 5000) == 1
        pids = [node.pid for node in [*group.servers, *group.sentinels]]
    finally:
        group.stop()
    assert_gone(pids, group.workdir)
