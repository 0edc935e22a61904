"""Lease acquire+release cycles per second: RedisLeases against the raw floor.

The floor is what a hand-written lock costs with redis.asyncio: ``SET NX PX``
to acquire and a Lua compare-and-delete (by SHA) to release, one round trip
each. RedisLeases does the same two round trips but its acquire script also
hands out a fence, and every call runs under a timeout. Both run against one
private redis-server in the same process, in short paired rounds so
machine noise hits both alike; the figure that matters is the median ratio
within pairs.

``--topology sentinel`` runs the same against a local Sentinel group (master
and one replica) through the Sentinel master client, twice: without replica
acknowledgement (``replicas=0`` against the floor) and with it (``replicas=1``
against the floor plus a ``WAIT 1`` after its ``SET``, on the same connection).
``--topology cluster`` does the same on a local six-node cluster (three shards
of master and replica); its floor sends each key's commands to the primary
that owns the key's slot, through one plain client per primary.

    .venv/bin/python bench/lease_ops.py [--cycles 1500] [--rounds 21]
        [--topology single|sentinel|cluster]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator

import anyio
from redis.asyncio import Redis, RedisCluster
from redis.commands.core import AsyncScript

from leaseworker import RedisLeases, redis_from_url
from leaseworker._lease._scripts import RELEASE
from leaseworker_dev._services import LocalRedis, LocalRedisCluster, LocalSentinelGroup

Cycle = Callable[[str, list[float]], Awaitable[None]]
"""One acquire+release of a key; appends each call's seconds to the list."""
Route = Callable[[str], Redis]


def floor_cycle(route: Route, *, wait: bool = False) -> Cycle:
    """Build the raw floor: SET NX PX (then ``WAIT 1`` when asked), then compare-and-delete.

    ``route`` gives the client for a key: the one client, or its slot's primary.
    """
    releases: dict[int, AsyncScript] = {}  # one registered script per client

    def release(lock: str) -> AsyncScript:
        redis = route(lock)
        found = releases.get(id(redis))
        if found is None:
            found = releases[id(redis)] = redis.register_script(RELEASE)
        return found

    async def acquire(key: str, token: str) -> bool:
        redis = route(key)
        if not wait:
            return bool(await redis.set(key, token, nx=True, px=30_000))
        async with redis.pipeline(transaction=False) as pipe:
            pipe.set(key, token, nx=True, px=30_000)
            pipe.execute_command("WAIT", 1, 250)
            acquired, acked = await pipe.execute()
        return bool(acquired) and int(acked) >= 1

    async def cycle(key: str, calls: list[float]) -> None:
        token = secrets.token_hex(12)
        lock = f"floor:{{{key}}}:lock"
        sent = time.perf_counter()
        acquired = await acquire(lock, token)
        calls.append((answered := time.perf_counter()) - sent)
        if acquired:
            await release(lock)(keys=[lock], args=[token])
            calls.append(time.perf_counter() - answered)

    return cycle


def leaseworker_cycle(redis: Redis | RedisCluster, *, replicas: int = 0) -> Cycle:
    """Build RedisLeases.acquire then release (fence, owner token, timeouts, replica wait)."""
    leases = RedisLeases(redis, namespace="bench", replicas=replicas)

    async def cycle(key: str, calls: list[float]) -> None:
        sent = time.perf_counter()
        lease = await leases.acquire(key, 30)
        calls.append((answered := time.perf_counter()) - sent)
        if lease is not None:
            await leases.release(lease)
            calls.append(time.perf_counter() - answered)

    return cycle


async def cycles_per_second(
    cycle: Cycle,
    *,
    cycles: int,
    tasks: int,
    calls: list[float] | None = None,
    cpu: list[float] | None = None,
) -> float:
    """Run ``cycles`` cycles spread over ``tasks`` concurrent tasks (distinct keys).

    Each call's seconds go to ``calls`` when given; the process's CPU seconds
    per cycle (the client's: Redis runs in its own process) to ``cpu``.
    """
    per_task = cycles // tasks
    seconds = [] if calls is None else calls

    async def run(task: int) -> None:
        for i in range(per_task):
            await cycle(f"k{task}:{i % 64}", seconds)

    started, used = time.perf_counter(), time.process_time()
    async with anyio.create_task_group() as tg:
        for task in range(tasks):
            tg.start_soon(run, task)
    if cpu is not None:
        cpu.append((time.process_time() - used) / (per_task * tasks))
    return per_task * tasks / (time.perf_counter() - started)


@dataclasses.dataclass
class Line:
    """One concurrency level: paired (floor, leaseworker) cycles/s, and each call's seconds."""

    pairs: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    cpu: dict[str, list[float]] = dataclasses.field(
        default_factory=lambda: {"floor": [], "ours": []}
    )
    floor_calls: list[float] = dataclasses.field(default_factory=list)
    our_calls: list[float] = dataclasses.field(default_factory=list)


async def measure(
    redis: Redis | RedisCluster, route: Route, *, cycles: int, rounds: int, replicas: int
) -> dict[int, Line]:
    """Paired (floor, leaseworker) cycles/s samples and call latencies per concurrency level.

    Each round measures both contenders back to back, alternating which goes
    first, so a pair shares whatever else the machine was doing at the time;
    the ratio is taken within each pair. With ``replicas`` the floor waits for
    that replica too.
    """
    floor = floor_cycle(route, wait=replicas > 0)
    ours = leaseworker_cycle(redis, replicas=replicas)
    results: dict[int, Line] = {}
    for tasks in (1, 50):
        for cycle in (floor, ours):  # warm-up: connections, script cache
            await cycles_per_second(cycle, cycles=min(cycles, 500), tasks=tasks)
        line = results.setdefault(tasks, Line())
        calls = {floor: line.floor_calls, ours: line.our_calls}
        cpu = {floor: line.cpu["floor"], ours: line.cpu["ours"]}
        for round_no in range(rounds):
            order = (floor, ours) if round_no % 2 == 0 else (ours, floor)
            rate = {
                c: await cycles_per_second(
                    c, cycles=cycles, tasks=tasks, calls=calls[c], cpu=cpu[c]
                )
                for c in order
            }
            line.pairs.append((rate[floor], rate[ours]))
    return results


async def measure_all(
    url: str, *, cycles: int, rounds: int, replica_counts: tuple[int, ...]
) -> dict[int, dict[int, Line]]:
    """Measure each replica count over one client of ``url`` (closed at the end)."""
    redis = redis_from_url(url)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(redis.aclose)
        if isinstance(redis, RedisCluster):
            route = await _primaries(redis, stack)
        else:
            redis.connection_pool.max_connections = 64
            route = _one(redis)
        return {
            n: await measure(redis, route, cycles=cycles, rounds=rounds, replicas=n)
            for n in replica_counts
        }
    raise AssertionError("unreachable")


def _one(redis: Redis) -> Route:
    return lambda _key: redis


async def _primaries(cluster: RedisCluster, stack: contextlib.AsyncExitStack) -> Route:
    """Route each key to a plain client of its slot's primary (closed with ``stack``)."""
    await cluster.initialize()
    clients: dict[str, Redis] = {}
    for node in cluster.get_primaries():
        client = Redis(host=node.host, port=int(node.port), max_connections=64)
        stack.push_async_callback(client.aclose)
        clients[node.name] = client

    def route(key: str) -> Redis:
        node = cluster.get_node_from_key(key)
        assert node is not None
        return clients[node.name]

    return route


def main() -> None:
    """Start a private redis-server, measure, print a table of ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cycles", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--topology", choices=("single", "sentinel", "cluster"), default="single")
    args = parser.parse_args()
    counts = (0,) if args.topology == "single" else (0, 1)
    with _topology(args.topology) as url:
        results = anyio.run(
            lambda: measure_all(url, cycles=args.cycles, rounds=args.rounds, replica_counts=counts)
        )
    header = ("replicas", "tasks", "floor cyc/s", "leaseworker cyc/s", "ratio", "(quartiles)")
    print(
        "{:>8}  {:>5}  {:>12}  {:>18}  {:>6}  {:>13}  per call p50/p99 ms: floor | ours"
        "  CPU us/cycle: floor | ours".format(*header)
    )
    for replicas, levels in results.items():
        for tasks, line in levels.items():
            floor = statistics.median(f for f, _ in line.pairs)
            ours = statistics.median(o for _, o in line.pairs)
            q1, ratio, q3 = statistics.quantiles([o / f for f, o in line.pairs], n=4)
            print(
                f"{replicas:>8}  {tasks:>5}  {floor:>12.0f}  {ours:>18.0f}  {ratio:>5.2f}x  "
                f"({q1:.2f}-{q3:.2f})  {_p50_p99(line.floor_calls)} | {_p50_p99(line.our_calls)}"
                f"  {statistics.median(line.cpu['floor']) * 1e6:.0f} | "
                f"{statistics.median(line.cpu['ours']) * 1e6:.0f}"
            )
    print("target: ratio >= 1.0x with 1 task, >= 2.0x with 50 (median of paired rounds;")
    print("replicas=1 against the floor that also WAITs for one replica)")


def _p50_p99(seconds: list[float]) -> str:
    cuts = statistics.quantiles(seconds, n=100)
    return f"{cuts[49] * 1000:.2f}/{cuts[98] * 1000:.2f}"


@contextlib.contextmanager
def _topology(name: str) -> Iterator[str]:
    """Start the local Redis of ``name`` and yield its URL; stop it afterwards."""
    if name == "single":
        server = LocalRedis.start()
        try:
            yield server.url
        finally:
            server.stop()
        return
    if name == "cluster":
        cluster = LocalRedisCluster.start()
        try:
            yield cluster.url
        finally:
            cluster.stop()
        return
    group = LocalSentinelGroup.start(replicas=1)
    try:
        yield group.url
    finally:
        group.stop()


if __name__ == "__main__":
    main()
