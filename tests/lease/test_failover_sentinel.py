"""Through real Sentinel failovers, A's body stops before B's acquire succeeds.

A holds a lease through ``hold()`` on a Sentinel master client; the group
fails over; B, connecting after the switch, tries to acquire the same key
until it gets it. Every time is read on this process's monotonic clock, so
``overlap = A stopped - B acquired`` is exact (0 or less: no overlap). With
``replicas=0`` the same scenarios overlap, which is why the default for
Sentinel URLs is 1 (bench/README.md quotes these runs). In every scenario
B's fence is above A's, even where the promoted replica never saw A's
acquire (the fence counter is lost; the server-time floor holds).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
import pytest
from redis.asyncio import Redis

from leaseworker import Lease, LeaseUnavailable, RedisLeases, hold, redis_from_url
from leaseworker._lease import now
from leaseworker_dev._services import LocalSentinelGroup

from ..waiting import eventually


@pytest.fixture
async def settled(sentinel_group: LocalSentinelGroup) -> LocalSentinelGroup:
    """The group, healthy again whatever the previous scenario did to it."""
    await sentinel_group.settle()
    return sentinel_group


async def test_the_url_client_follows_the_master_and_closes_everything(
    settled: LocalSentinelGroup,
) -> None:
    """``redis_from_url`` on the group's URL writes on the master; closing leaks nothing.

    The suite turns a ``ResourceWarning`` (an unclosed sentinel connection) into an error.
    """
    client = redis_from_url(settled.url)
    assert isinstance(client, Redis)
    try:
        await client.set("url-check", "1")
        assert (await client.info("replication"))["role"] == "master"
    finally:
        await client.aclose()


@pytest.mark.timeout(120)
async def test_a_pipelined_store_follows_the_master_after_a_failover(
    settled: LocalSentinelGroup,
) -> None:
    """The connection a pipelined store keeps reconnects through the sentinels.

    Reconnecting to its last address would find the demoted master ("the
    previous master is now a slave") at every call, for good.
    """
    client = redis_from_url(settled.url)
    assert isinstance(client, Redis)
    leases = RedisLeases(client, namespace=f"follow-{uuid.uuid4().hex[:8]}")
    try:
        lease = await leases.acquire("before", 5.0)
        assert lease is not None  # the kept connection is on the first master
        old = await settled.master()
        master = await settled.failover()
        demoted = Redis(host="127.0.0.1", port=old.port)

        async def replica() -> bool:
            return bool((await demoted.info("replication"))["role"] == "slave")

        try:
            await eventually(replica, within=30)  # the old master serves as a replica
        finally:
            await demoted.aclose()
        after: Lease | None = None
        with anyio.fail_after(30):
            while after is None:
                try:
                    after = await leases.acquire("after", 5.0)
                except LeaseUnavailable:
                    await anyio.sleep(0.2)  # the switch is still settling
        on_master = Redis(host="127.0.0.1", port=master.port)
        try:
            assert await on_master.exists(leases.lease_key("after"))
        finally:
            await on_master.aclose()
    finally:
        await leases.aclose()
        await client.aclose()


@dataclass
class Run:
    """What one scenario saw, on one monotonic clock (``math.inf``: never)."""

    a_started: float = math.inf
    a_stopped: float = math.inf
    b_acquired: float = math.inf
    a_unavailable: bool = False
    a_fence: int | None = None
    b_fence: int | None = None

    @property
    def overlap(self) -> float:
        """Seconds both bodies ran at once (<= 0: A had stopped before B acquired)."""
        if self.a_started == math.inf:
            return -math.inf  # A never ran
        return self.a_stopped - self.b_acquired


async def scenario(
    group: LocalSentinelGroup,
    *,
    replicas: int,
    lease_duration: float,
    fail: Callable[[Run], Awaitable[None]],
) -> Run:
    """Run A's hold, call ``fail`` once A is in (or refused), then let B acquire.

    A's body runs until the lease stops it (or 3 TTLs after B acquired, so a
    scenario that overlaps still ends); B retries every 50 ms on a client made
    after the failover, as a pod started then would.
    """
    run = Run()
    key = f"k{uuid.uuid4().hex[:8]}"
    in_or_refused = anyio.Event()
    b_done = anyio.Event()
    async with group.master_client() as a_client:
        # A replica has 1.5 s to acknowledge: a loaded machine never runs past it, and the
        # cut-off replicas (the first test) never acknowledge at all.
        a = RedisLeases(a_client, command_timeout=2.0, replicas=replicas, replica_timeout=1.5)

        async def hold_a() -> None:
            try:
                async with hold(
                    a, key, lease_duration=lease_duration, renewal_interval=lease_duration / 4
                ) as held:
                    run.a_started, run.a_fence = now(), held.fence
                    in_or_refused.set()
                    try:
                        with anyio.move_on_after(3 * lease_duration + 30):
                            await b_done.wait()
                            await anyio.sleep(3 * lease_duration)  # an overlapping A still ends
                    finally:
                        run.a_stopped = now()
            except LeaseUnavailable:
                run.a_unavailable = True
            except Exception:  # lost (or timed out): the body was stopped, as measured
                pass
            finally:
                in_or_refused.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(hold_a)
            with anyio.fail_after(30):
                await in_or_refused.wait()
            await fail(run)
            async with group.master_client() as b_client:
                b = RedisLeases(b_client, command_timeout=2.0)
                with anyio.fail_after(3 * lease_duration + 30):
                    lease = await _acquire_when_free(b, key, lease_duration)
                run.b_acquired = lease.sent_at  # B may run from when its acquire was sent
                run.b_fence = lease.fence
                b_done.set()
                await b.release(lease)
    if run.a_fence is not None:  # the failover may have lost the counter: the time floor holds
        assert run.b_fence is not None, run
        assert run.b_fence > run.a_fence, run
    return run


async def _acquire_when_free(leases: RedisLeases, key: str, lease_duration: float) -> Lease:
    """Acquire as a pod would: every 50 ms until the lease is free (polling Redis itself)."""
    while True:
        try:
            lease = await leases.acquire(key, lease_duration)
        except LeaseUnavailable:  # the master is switching: try again
            lease = None
        if lease is not None:
            return lease
        await anyio.sleep(0.05)


def _killed_before_replicating(group: LocalSentinelGroup) -> Callable[[Run], Awaitable[None]]:
    """Redis's documented failure: the master dies before any replica got the lease.

    The replicas were cut off before A's acquire; the master is SIGKILLed,
    they resume and one is promoted without A's lease.
    """

    async def fail(run: Run) -> None:
        old = await group.master()
        group.kill(old)
        for node in group.servers:
            if node.paused:
                group.resume(node)
        await group.wait_for_new_master(old)

    return fail


async def _cut_off_replicas(group: LocalSentinelGroup) -> None:
    master = await group.master()
    for node in group.servers:
        if node is not master:
            await group.cut_off(node)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("replicas", [0, 1])
async def test_the_master_dies_before_replicating_the_lease(
    settled: LocalSentinelGroup, replicas: int
) -> None:
    """Replication held back, A acquires, the master is SIGKILLed, a replica is promoted.

    The promoted replica never saw A's lease, so B gets it at once. With
    ``replicas=1`` A's acquire was not acknowledged: A never started. With
    ``replicas=0`` A ran on until its next renewal failed: the overlap.
    """
    await _cut_off_replicas(settled)
    run = await scenario(
        settled, replicas=replicas, lease_duration=24.0, fail=_killed_before_replicating(settled)
    )
    print(f"overlap with replicas={replicas}: {run.overlap:.2f}s")
    if replicas:
        assert run.a_unavailable
        assert run.overlap < 0
    else:
        assert run.a_started < run.b_acquired
        assert run.overlap > 0, run  # the measured reason replicas defaults to 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("replicas", [0, 1])
async def test_a_connection_left_on_the_demoted_master(
    settled: LocalSentinelGroup, replicas: int
) -> None:
    """SENTINEL FAILOVER with the replicas in sync; A's pooled connection stays on the old master.

    The old master acts as a master for seconds after the switch, so A's
    renewals there succeed; with ``replicas=1`` each reports ``WAIT`` 0 (its
    replicas left with the switch) and A stops before the promoted replica's
    copy of the lease expires and B acquires.
    """

    async def fail(run: Run) -> None:
        await settled.failover()

    run = await scenario(settled, replicas=replicas, lease_duration=4.0, fail=fail)
    print(f"overlap with replicas={replicas}: {run.overlap:.2f}s")
    assert run.a_started < run.b_acquired
    if replicas:
        assert run.overlap < 0, run
    else:
        assert run.overlap > 0, run


@pytest.mark.timeout(120)
@pytest.mark.parametrize("replicas", [0, 1])
async def test_the_master_killed_after_replicating_the_lease(
    settled: LocalSentinelGroup, replicas: int
) -> None:
    """The replicas have A's lease; the master is SIGKILLed and a replica promoted.

    A's renewals find no master until the switch, so A stops at its local
    deadline; the promoted replica's copy expires from A's last renewal it
    saw, which is after that deadline: B acquires only once A has stopped,
    with or without replica acknowledgement.
    """

    async def fail(run: Run) -> None:
        old = await settled.master()
        settled.kill(old)
        await settled.wait_for_new_master(old)

    run = await scenario(settled, replicas=replicas, lease_duration=4.0, fail=fail)
    print(f"overlap with replicas={replicas}: {run.overlap:.2f}s")
    assert run.a_started < run.b_acquired
    assert run.overlap < 0, run
