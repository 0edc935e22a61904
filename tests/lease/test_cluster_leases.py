"""RedisLeases on a real local Redis Cluster: routing, pipelining, failovers, moved slots.

Each call goes to the primary that owns its key's slot, pipelined per node
with its ``WAIT``. The invariant checked through failovers: A's body has
stopped strictly before B's acquire succeeds, on one monotonic clock.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator

import anyio
import pytest
from redis.asyncio import RedisCluster

from leaseworker import (
    Event,
    HeldLease,
    Lease,
    LeaseEvent,
    LeaseLost,
    LeaseUnavailable,
    RedisLeases,
    hold,
)
from leaseworker._lease import now
from leaseworker_dev._services import LocalRedisCluster, RedisNode
from leaseworker_dev._services._cluster import slot_of


@pytest.fixture
def cluster(redis_cluster: LocalRedisCluster) -> LocalRedisCluster:
    """The session's cluster (see ``tests/conftest.py``), under a short name."""
    return redis_cluster


@pytest.fixture
async def client(cluster: LocalRedisCluster) -> AsyncIterator[RedisCluster]:
    """A cluster client on the healthy cluster (settled again after the previous test)."""
    await cluster.settle()
    client = RedisCluster(startup_nodes=cluster.startup_nodes())
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def leases(client: RedisCluster) -> AsyncIterator[RedisLeases]:
    """Replica-acknowledged leases over the cluster client, pipelined per node.

    The replica budget is short so that a cut-off shard's ``WAIT`` runs out
    quickly; tests whose subject is not replication use ``roomy_leases``.
    """
    leases = RedisLeases(
        client,
        namespace=f"t{uuid.uuid4().hex[:8]}",
        command_timeout=1.0,
        replicas=1,
        replica_timeout=0.2,
    )
    try:
        yield leases
    finally:
        await leases.aclose()


@pytest.fixture
async def roomy_leases(client: RedisCluster) -> AsyncIterator[RedisLeases]:
    """Replica-acknowledged leases with a budget a loaded machine cannot exhaust.

    Sixty acquires in flight on a 2-core machine running the suite under
    coverage once took longer than 200 ms for a replica to acknowledge: the
    test then failed on timing that was not its subject. A lease held while
    its slot migrates would fail the same way on one slow acknowledgement.
    """
    leases = RedisLeases(
        client,
        namespace=f"t{uuid.uuid4().hex[:8]}",
        command_timeout=3.0,
        replicas=1,
        replica_timeout=2.0,
    )
    try:
        yield leases
    finally:
        await leases.aclose()


async def _keys_on_every_shard(cluster: LocalRedisCluster, leases: RedisLeases) -> list[str]:
    """One job key per shard (by its lease key's slot)."""
    found: dict[int, str] = {}
    for i in range(200):
        key = f"job-{i}"
        found.setdefault(await cluster.shard_of(leases.lease_key(key)), key)
        if len(found) == 3:
            return [found[shard] for shard in sorted(found)]
    raise AssertionError("no key on some shard")


async def test_sixty_concurrent_holds_across_shards_with_pipelining(
    cluster: LocalRedisCluster, roomy_leases: RedisLeases
) -> None:
    """Concurrent calls queue per node and go as one pipeline each: every hold completes."""
    leases = roomy_leases
    keys = [f"job-{i}" for i in range(60)]
    shards = {await cluster.shard_of(leases.lease_key(k)) for k in keys}
    assert shards == {0, 1, 2}
    outcomes: list[str | None] = []

    async def one(key: str) -> None:
        async with hold(leases, key, lease_duration=8, renewal_interval=0.3) as held:
            await anyio.sleep(0.7)  # two renewals each, all in flight together
            await held.checkpoint()
        outcomes.append(held.outcome)

    async with anyio.create_task_group() as tg:
        for key in keys:
            tg.start_soon(one, key)
    assert outcomes == ["completed"] * 60
    for key in keys:
        assert (await leases.inspect(key)).owner is None


async def test_an_unacknowledged_acquire_on_a_cut_off_shard_never_starts(
    cluster: LocalRedisCluster, leases: RedisLeases
) -> None:
    """The shard's replica is cut off: WAIT says 0, so the acquire is undone."""
    key = (await _keys_on_every_shard(cluster, leases))[1]
    await cluster.cut_off(await cluster.shard_of(leases.lease_key(key)))
    with pytest.raises(LeaseUnavailable, match="0 of 1 replicas"):
        async with hold(leases, key, lease_duration=2):
            pytest.fail("the body started on an unreplicated lease")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["cluster_failover", "kill_master"])
async def test_a_shard_failover_never_lets_two_bodies_run(
    cluster: LocalRedisCluster, client: RedisCluster, leases: RedisLeases, how: str
) -> None:
    """A holds a key on a shard that fails over; B acquires once it can: A stopped first.

    Killed, the master takes A's renewals with it, and A's body (60 s) must be stopped by
    its lease. A graceful failover keeps the lease: A renews twice on the new master (or
    is stopped), B is refused while A holds, then A's body ends and B acquires after A's
    release (not polling meanwhile: an acquire sent as A's body ends is granted after
    A's release, yet stamped before the body's end).
    """
    key = (await _keys_on_every_shard(cluster, leases))[0]
    shard = await cluster.shard_of(leases.lease_key(key))
    a_stopped = math.inf
    b_acquired = math.inf
    a_fence = 0
    in_body = anyio.Event()
    a_renewals: list[float] = []
    renewed_or_stopped = anyio.Event()
    failed_over = math.inf
    a_done = anyio.Event()
    a_released = anyio.Event()

    def on_event(event: Event) -> None:
        if isinstance(event, LeaseEvent) and event.name == "renewed":
            a_renewals.append(now())
            if sum(at > failed_over for at in a_renewals) >= 2:
                renewed_or_stopped.set()

    async def hold_a() -> None:
        nonlocal a_stopped, a_fence
        try:
            async with hold(
                leases, key, lease_duration=3, renewal_interval=0.75, hooks=[on_event]
            ) as held:
                a_fence = held.fence
                in_body.set()
                try:
                    with anyio.move_on_after(60):
                        await a_done.wait()
                finally:
                    a_stopped = now()
                    renewed_or_stopped.set()
        except LeaseLost:
            pass
        a_released.set()

    b_client = RedisCluster(startup_nodes=cluster.startup_nodes())
    b = RedisLeases(b_client, namespace=leases.namespace, replicas=1)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold_a)
            await in_body.wait()
            if how == "cluster_failover":
                await cluster.failover(shard)
                failed_over = now()
                with anyio.fail_after(30):
                    await renewed_or_stopped.wait()
                if a_stopped == math.inf:  # A holds it on the new master: B is refused
                    assert await b.acquire(key, 3) is None
                a_done.set()
                with anyio.fail_after(10):
                    await a_released.wait()
            else:
                await cluster.kill_master(shard)
                # The promoted replica is alone in its shard: with replicas=1 nobody can
                # acquire there until the old master is back as its replica.
                await cluster.settle()
            with anyio.fail_after(60):
                lease = await _acquire_when_free(b, key)
            b_acquired = lease.sent_at
            tg.cancel_scope.cancel()  # an A still running at this point is the failure
        await b.release(lease)
    finally:
        # Outside the cancelled scope: closing inside it would be cut at its first await.
        try:
            await b.aclose()
        finally:
            await b_client.aclose()
    assert a_stopped < b_acquired, (a_stopped, b_acquired)
    assert lease.fence > a_fence  # whether or not the promoted replica had the counter


async def test_a_moved_slot_is_followed_without_losing_the_lease(
    cluster: LocalRedisCluster, roomy_leases: RedisLeases
) -> None:
    """The slot of a held lease moves to another shard: the next renewal follows MOVED."""
    leases = roomy_leases  # following the slot is the subject, not the replica's budget
    key = (await _keys_on_every_shard(cluster, leases))[0]
    shard = await cluster.shard_of(leases.lease_key(key))
    other = await cluster.shard_master((shard + 1) % 3)
    async with hold(leases, key, lease_duration=8, renewal_interval=0.5) as held:
        await cluster.migrate_slot(slot_of(leases.lease_key(key)), other)
        renewals = held.renewals
        with anyio.fail_after(10):
            while held.renewals < renewals + 2:
                await held.checkpoint()
                await anyio.sleep(0.1)
    assert held.outcome == "completed"
    assert await cluster.shard_of(leases.lease_key(key)) != shard


async def test_a_slot_in_mid_migration_is_followed_by_ask_then_moved(
    cluster: LocalRedisCluster, roomy_leases: RedisLeases
) -> None:
    """The held lease's keys move while the slot is still migrating (ASK), then it ends (MOVED)."""
    leases = roomy_leases  # following the slot is the subject, not the replica's budget
    key = (await _keys_on_every_shard(cluster, leases))[1]
    slot = slot_of(leases.lease_key(key))
    shard = await cluster.shard_of(leases.lease_key(key))
    other = await cluster.shard_master((shard + 1) % 3)
    async with hold(leases, key, lease_duration=8, renewal_interval=0.5) as held:
        await cluster.migrate_slot(slot, other, finish=False)
        await _renewals(held, 2)  # the old owner answers ASK: each renewal goes after ASKING
        await cluster.finish_slot_migration(slot)
        await _renewals(held, 2)  # now MOVED
    assert held.outcome == "completed"
    assert await cluster.shard_of(leases.lease_key(key)) != shard


async def _renewals(held: HeldLease, count: int) -> None:
    """Return once ``count`` more renewals succeeded (the body checkpoints meanwhile)."""
    target = held.renewals + count
    with anyio.fail_after(10):
        while held.renewals < target:
            await held.checkpoint()
            await anyio.sleep(0.1)


async def _acquire_when_free(leases: RedisLeases, key: str) -> Lease:
    """Acquire as a pod would: every 50 ms until the lease is free (polling Redis itself)."""
    while True:
        try:
            lease = await leases.acquire(key, 3)
        except LeaseUnavailable:  # the shard is switching: try again
            lease = None
        if lease is not None:
            return lease
        await anyio.sleep(0.05)


@pytest.mark.parametrize("pipelining", [True, False], ids=["pipelined", "lone"])
async def test_a_first_renewal_with_the_shard_replica_paused_waits_for_it_once(
    client: RedisCluster, cluster: LocalRedisCluster, pipelining: bool
) -> None:
    """A shard master that never ran the renewal script: refused as unreplicated after one ``WAIT``.

    Sent as ``EVALSHA`` + ``WAIT`` and answered NOSCRIPT, the renewal would
    wait 1.5 s for the paused replica, then 1.5 s more after the load: a
    timeout at the 2 s command timeout instead.
    """
    leases = RedisLeases(
        client,
        namespace=f"t{uuid.uuid4().hex[:8]}",
        command_timeout=2.0,
        replicas=1,
        replica_timeout=1.5,
        pipelining=pipelining,
    )
    shard = await cluster.shard_of(leases.lease_key("k"))
    master = await cluster.shard_master(shard)
    replica = next(node for node in cluster.shard_nodes(shard) if node is not master)
    await anyio.to_thread.run_sync(lambda: master.command("SCRIPT", "FLUSH"))
    try:
        lease = await leases.acquire("k", 10)
        assert lease is not None
        waits = await anyio.to_thread.run_sync(lambda: _waits(master))
        cluster.pause(replica)
        with pytest.raises(LeaseLost) as lost, anyio.fail_after(10):
            await leases.renew(lease)
        assert lost.value.reason == "unreplicated"
        assert await anyio.to_thread.run_sync(lambda: _waits(master)) == waits + 1
    finally:
        cluster.resume(replica)
        await leases.aclose()


def _waits(node: RedisNode) -> int:
    """How many ``WAIT`` commands ``node`` has run (``INFO commandstats``)."""
    line = node.info("commandstats").get("cmdstat_wait", "calls=0")  # calls=N,usec=...
    return int(dict(pair.split("=") for pair in line.split(","))["calls"])
