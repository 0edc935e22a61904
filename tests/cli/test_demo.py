"""The incident demo: the naive lock overlaps, hold() does not (real Redis)."""

from __future__ import annotations

from redis.asyncio import Redis

from leaseworker._dev._incident import leaseworker_run, naive_run
from leaseworker._dev._services import LocalRedis


async def test_naive_lock_overlaps_and_hold_does_not(
    redis: Redis, redis_server: LocalRedis
) -> None:
    """The demo's two timelines show the incident and its fix on one clock."""
    naive = await naive_run(redis, ttl=0.5)
    assert naive.overlap() > 0.3
    assert any("deleted 0 key(s)" in text for _, _, text in naive.events)
    fixed = await leaseworker_run(redis, redis_server.port, ttl=0.5)
    assert fixed.overlap() == 0
    a_stop = fixed.intervals["A"][1]
    b_start = fixed.intervals["B"][0]
    assert a_stop < b_start
    assert any("LeaseLost" in text for _, _, text in fixed.events)
