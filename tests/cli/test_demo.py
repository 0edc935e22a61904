"""The incident and failover demos: the unsafe run overlaps, the leaseworker one does not."""

from __future__ import annotations

from redis.asyncio import Redis

from leaseworker_dev._demos._failover import failover_run
from leaseworker_dev._demos._incident import cpu_run, leaseworker_run, naive_run
from leaseworker_dev._services import LocalRedis, LocalSentinelGroup


async def test_naive_lock_overlaps_and_hold_does_not(
    redis: Redis, redis_server: LocalRedis
) -> None:
    """The demo's two timelines show the incident and its fix on one clock."""
    naive = await naive_run(redis, lease_duration=0.5)
    assert naive.overlap() > 0.3
    assert any("deleted 0 key(s)" in text for _, _, text in naive.events)
    fixed = await leaseworker_run(redis, redis_server.port, lease_duration=0.5)
    assert fixed.overlap() == 0
    a_stop = fixed.intervals["A"][1]
    b_start = fixed.intervals["B"][0]
    assert a_stop < b_start
    assert any("LeaseLost" in text for _, _, text in fixed.events)


async def test_a_cpu_loop_overlaps_in_the_event_loop_and_not_through_run_in_process(
    redis: Redis, redis_server: LocalRedis
) -> None:
    """The CPU-bound incident side by side, judged by A's marks and its child's exit time."""
    in_loop = await cpu_run(redis, redis_server.port, 1.0, "loop")
    assert in_loop.overlap() > 0.3
    assert any("reason=loop_blocked" in text for _, _, text in in_loop.events)
    in_child = await cpu_run(redis, redis_server.port, 1.0, "process")
    assert in_child.overlap() == 0
    exits = [at for at, worker, text in in_child.events if "exited (the kernel's time" in text]
    assert len(exits) == 1  # the child's exit is on the timeline, from a pidfd
    assert exits[0] <= in_child.intervals["A"][1] < in_child.intervals["B"][0]
    assert any("LeaseLost" in text for _, _, text in in_child.events)


async def test_the_failover_demo_overlaps_without_replica_acks_and_not_with_them() -> None:
    """On a real Sentinel group: replicas=0 lets both run; replicas=1 keeps A from starting."""
    group = LocalSentinelGroup.start()
    try:
        unacknowledged = await failover_run(group, replicas=0)
        acknowledged = await failover_run(group, replicas=1)
    finally:
        group.stop()
    assert unacknowledged.overlap() > 0
    assert acknowledged.overlap() == 0
    assert any("acquire refused" in text for _, _, text in acknowledged.events)
    assert acknowledged.intervals["B"][0] > 0  # B did get the lease on the new master
