"""Lease acquire+release cycles per second: RedisLeases against the raw floor.

The floor is what a hand-written lock costs with redis.asyncio: ``SET NX PX``
to acquire and a Lua compare-and-delete (by SHA) to release, one round trip
each. RedisLeases does the same two round trips but its acquire script also
hands out a fence, and every call runs under a timeout. Both run against one
private redis-server in the same process, interleaved round by round so
machine noise hits both alike; the figure that matters is the ratio.

    .venv/bin/python bench/lease_ops.py [--cycles 4000] [--rounds 5]
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
from leaseworker._local import LocalRedis
from leaseworker._scripts import RELEASE

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


async def measure(url: str, *, cycles: int, rounds: int) -> dict[int, tuple[float, float]]:
    """Median cycles/s of (floor, leaseworker) per concurrency level."""
    redis = Redis.from_url(url, max_connections=64)
    contenders = {"floor": floor_cycle(redis), "leaseworker": leaseworker_cycle(redis)}
    results: dict[int, tuple[float, float]] = {}
    try:
        for tasks in (1, 50):
            samples: dict[str, list[float]] = {name: [] for name in contenders}
            for cycle in contenders.values():  # warm-up: connections, script cache
                await cycles_per_second(cycle, cycles=min(cycles, 500), tasks=tasks)
            for _ in range(rounds):
                for name, cycle in contenders.items():
                    samples[name].append(await cycles_per_second(cycle, cycles=cycles, tasks=tasks))
            results[tasks] = (
                statistics.median(samples["floor"]),
                statistics.median(samples["leaseworker"]),
            )
    finally:
        await redis.aclose()
    return results


def main() -> None:
    """Start a private redis-server, measure, print a table of ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cycles", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    server = LocalRedis.start()
    try:
        results = anyio.run(lambda: measure(server.url, cycles=args.cycles, rounds=args.rounds))
    finally:
        server.stop()
    print(f"{'tasks':>5}  {'floor cyc/s':>12}  {'leaseworker cyc/s':>18}  {'ratio':>6}")
    for tasks, (floor, ours) in results.items():
        print(f"{tasks:>5}  {floor:>12.0f}  {ours:>18.0f}  {ours / floor:>6.2f}x")


if __name__ == "__main__":
    main()
