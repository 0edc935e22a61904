"""Lease acquire+release cycles per second: RedisLeases against the raw floor.

The floor is what a hand-written lock costs with redis.asyncio: ``SET NX PX``
to acquire and a Lua compare-and-delete (by SHA) to release, one round trip
each. RedisLeases does the same two round trips but its acquire script also
hands out a fence, and every call runs under a timeout. Both run against one
private redis-server in the same process, in short paired rounds so
machine noise hits both alike; the figure that matters is the median ratio
within pairs.

    .venv/bin/python bench/lease_ops.py [--cycles 1500] [--rounds 21]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable

import anyio
from redis.asyncio import Redis

from leaseworker import RedisLeases
from leaseworker._dev._services import LocalRedis
from leaseworker._lease._scripts import RELEASE

Cycle = Callable[[str], Awaitable[None]]


def floor_cycle(redis: Redis) -> Cycle:
    """Build the raw floor: SET NX PX, then compare-and-delete by SHA."""
    release = redis.register_script(RELEASE)

    async def cycle(key: str) -> None:
        token = secrets.token_hex(12)
        if await redis.set(f"floor:{{{key}}}:lock", token, nx=True, px=30_000):
            await release(keys=[f"floor:{{{key}}}:lock"], args=[token])

    return cycle


def leaseworker_cycle(redis: Redis) -> Cycle:
    """Build RedisLeases.acquire then release (fence, owner token, timeouts)."""
    leases = RedisLeases(redis, namespace="bench")

    async def cycle(key: str) -> None:
        lease = await leases.acquire(key, 30)
        if lease is not None:
            await leases.release(lease)

    return cycle


async def cycles_per_second(cycle: Cycle, *, cycles: int, tasks: int) -> float:
    """Run ``cycles`` cycles spread over ``tasks`` concurrent tasks (distinct keys)."""
    per_task = cycles // tasks

    async def run(task: int) -> None:
        for i in range(per_task):
            await cycle(f"k{task}:{i % 64}")

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for task in range(tasks):
            tg.start_soon(run, task)
    return per_task * tasks / (time.perf_counter() - started)


async def measure(url: str, *, cycles: int, rounds: int) -> dict[int, list[tuple[float, float]]]:
    """Paired (floor, leaseworker) cycles/s samples per concurrency level.

    Each round measures both contenders back to back, alternating which goes
    first, so a pair shares whatever else the machine was doing at the time;
    the ratio is taken within each pair.
    """
    redis = Redis.from_url(url, max_connections=64)
    floor, ours = floor_cycle(redis), leaseworker_cycle(redis)
    results: dict[int, list[tuple[float, float]]] = {}
    try:
        for tasks in (1, 50):
            for cycle in (floor, ours):  # warm-up: connections, script cache
                await cycles_per_second(cycle, cycles=min(cycles, 500), tasks=tasks)
            pairs = results.setdefault(tasks, [])
            for round_no in range(rounds):
                order = (floor, ours) if round_no % 2 == 0 else (ours, floor)
                rate = {c: await cycles_per_second(c, cycles=cycles, tasks=tasks) for c in order}
                pairs.append((rate[floor], rate[ours]))
    finally:
        await redis.aclose()
    return results


def main() -> None:
    """Start a private redis-server, measure, print a table of ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cycles", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    server = LocalRedis.start()
    try:
        results = anyio.run(lambda: measure(server.url, cycles=args.cycles, rounds=args.rounds))
    finally:
        server.stop()
    header = ("tasks", "floor cyc/s", "leaseworker cyc/s", "ratio", "(quartiles)")
    print("{:>5}  {:>12}  {:>18}  {:>6}  {:>13}".format(*header))
    for tasks, pairs in results.items():
        floor = statistics.median(f for f, _ in pairs)
        ours = statistics.median(o for _, o in pairs)
        q1, ratio, q3 = statistics.quantiles([o / f for f, o in pairs], n=4)
        print(f"{tasks:>5}  {floor:>12.0f}  {ours:>18.0f}  {ratio:>5.2f}x  ({q1:.2f}-{q3:.2f})")
    print("target: ratio >= 0.90x at both levels (median of paired rounds)")


if __name__ == "__main__":
    main()
