"""Dispatch to a child process: run_in_process against anyio.to_process and ProcessPoolExecutor.

Each side runs the same function with the same arguments in a warm pool of
``--workers`` children (default: the cores) and awaits its result:

- ``pool``: leaseworker's ``ProcessPool.run`` (what ``ctx.run_in_process``
  and ``held.run_in_process`` call), a far deadline, nothing to follow;
- ``held``: ``held.run_in_process`` inside one ``hold()`` on a private
  redis-server (the lease renewing meanwhile), the user's path;
- ``anyio``: ``anyio.to_process.run_sync(cancellable=True)`` under a
  limiter of ``--workers`` (the cancellable kind: the only one that can be
  stopped, which is the point of run_in_process);
- ``executor``: ``loop.run_in_executor`` on a ``ProcessPoolExecutor`` of
  ``--workers`` (its default start method).

Two workloads: a no-op (the dispatch alone) and a job of 10 ms of CPU time
(``bench/process_jobs.py``), each sequentially (one call at a time) and
with one call in flight per worker. Rounds alternate the sides' order; a
figure is the median over rounds of a side's calls per second divided by the
baseline's in the same round (target: ``pool`` and ``held`` >= 1.0x of both
baselines). ``CPU us/call`` is the calling process's own CPU per call (the
pod's cost of a dispatch; the children's is not in it). Last, the memory of
an idle worker of each pool: its resident set (``VmRSS``) and its
proportional share (``Pss``, shared pages split between the processes that
map them), medians over the workers.

    .venv/bin/python bench/process_dispatch.py [--rounds 7] [--calls 1000]
        [--cpu-calls 200] [--workers N] [--sides pool,held,anyio,executor]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import secrets
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_process
import process_jobs
from redis.asyncio import Redis

from leaseworker import ProcessPool, RedisLeases, hold
from leaseworker._process import Identity, Mirror
from leaseworker_dev._services import LocalRedis

BENCH = Path(__file__).resolve().parent
CPU_JOB = 0.010
"""Seconds of CPU time one call of the CPU workload burns."""

Call = Callable[[Callable[..., Any], tuple[object, ...]], Awaitable[object]]
"""Run ``fn(ctx, *args)`` in a child and return its result (``ctx`` as the side passes it)."""


@dataclass
class Side:
    """One way of running a call in a child process."""

    name: str
    call: Call


@dataclass
class Line:
    """One workload at one concurrency: each side's rate and CPU per call, per round."""

    rates: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)


def children_path() -> None:
    """Let every child process import ``process_jobs`` (this directory on ``PYTHONPATH``)."""
    paths = [str(BENCH), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)


def _unfollow() -> None:
    """Nothing to stop following: the bench's lease news never come."""


def _follow(_mirror: Mirror) -> Callable[[], None]:
    return _unfollow


@contextlib.asynccontextmanager
async def pool_side(workers: int) -> AsyncIterator[Side]:
    """``ProcessPool.run`` with a far deadline (what ``run_in_process`` calls)."""
    identity = Identity(job_key="bench", execution_id="bench-1", fence=1)
    async with ProcessPool(workers, preload=("process_jobs",)) as pool:
        await pool.start()

        async def call(fn: Callable[..., Any], args: tuple[object, ...]) -> object:
            deadline = time.monotonic() + 3600
            return await pool.run(
                fn, args, {}, identity=identity, deadline=deadline, follow=_follow
            )

        yield Side("pool", call)


@contextlib.asynccontextmanager
async def held_side(workers: int) -> AsyncIterator[Side]:
    """``held.run_in_process`` inside one ``hold()`` on a private redis-server."""
    server = LocalRedis.start()
    client = Redis.from_url(server.url)
    try:
        leases = RedisLeases(client, namespace=f"bench-{secrets.token_hex(3)}")
        async with (
            ProcessPool(workers, preload=("process_jobs",)) as pool,
            hold(leases, "bench:dispatch", lease_duration=30.0, processes=pool) as held,
        ):
            await pool.start()

            async def call(fn: Callable[..., Any], args: tuple[object, ...]) -> object:
                return await held.run_in_process(fn, *args)

            yield Side("held", call)
    finally:
        await client.aclose()
        server.stop()


@contextlib.asynccontextmanager
async def anyio_side(workers: int) -> AsyncIterator[Side]:
    """``anyio.to_process.run_sync`` (cancellable) under a limiter of ``workers``."""
    limiter = anyio.CapacityLimiter(workers)

    async def call(fn: Callable[..., Any], args: tuple[object, ...]) -> object:
        return await anyio.to_process.run_sync(fn, None, *args, cancellable=True, limiter=limiter)

    yield Side("anyio", call)


@contextlib.asynccontextmanager
async def executor_side(workers: int) -> AsyncIterator[Side]:
    """``loop.run_in_executor`` on a ``ProcessPoolExecutor`` of ``workers``."""
    executor = ProcessPoolExecutor(max_workers=workers)
    loop = asyncio.get_running_loop()

    async def call(fn: Callable[..., Any], args: tuple[object, ...]) -> object:
        return await loop.run_in_executor(executor, functools.partial(fn, None, *args))

    try:
        yield Side("executor", call)
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


async def rate(
    side: Side,
    fn: Callable[..., Any],
    args: tuple[object, ...],
    *,
    calls: int,
    tasks: int,
    cpu: list[float],
) -> float:
    """Run ``calls`` calls over ``tasks`` concurrent tasks; return calls per second."""
    per_task = calls // tasks

    async def run() -> None:
        for _ in range(per_task):
            await side.call(fn, args)

    began, used = time.perf_counter(), time.process_time()
    async with anyio.create_task_group() as tg:
        for _ in range(tasks):
            tg.start_soon(run)
    cpu.append((time.process_time() - used) / (per_task * tasks))
    return per_task * tasks / (time.perf_counter() - began)


async def measure(
    sides: list[Side], *, rounds: int, calls: int, cpu_calls: int, workers: int
) -> dict[tuple[str, int], Line]:
    """Paired rounds of every side, per workload and concurrency (the order rotating)."""
    workloads: list[tuple[str, Callable[..., Any], tuple[object, ...], int]] = [
        ("no-op", process_jobs.nothing, (), calls),
        (f"{CPU_JOB * 1000:.0f} ms CPU", process_jobs.burn, (CPU_JOB,), cpu_calls),
    ]
    results: dict[tuple[str, int], Line] = {}
    for name, fn, args, count in workloads:
        for tasks in sorted({1, workers}):
            for side in sides:  # warm: every worker started, the function's module imported
                await rate(side, fn, args, calls=4 * workers, tasks=workers, cpu=[])
            line = results.setdefault((name, tasks), Line())
            for round_no in range(rounds):
                shift = round_no % len(sides)
                for side in sides[shift:] + sides[:shift]:
                    cpu = line.cpu.setdefault(side.name, [])
                    found = await rate(side, fn, args, calls=count, tasks=tasks, cpu=cpu)
                    line.rates.setdefault(side.name, []).append(found)
    return results


async def memory(sides: list[Side], workers: int) -> dict[str, tuple[int, int, int]]:
    """Per side: its idle workers' median VmRSS and Pss (bytes) and how many were found."""
    found: dict[str, tuple[int, int, int]] = {}
    for side in sides:
        pids: set[int] = set()

        async def ask(side: Side = side, pids: set[int] = pids) -> None:
            pids.add(int(str(await side.call(process_jobs.pid_after, (0.3,)))))

        async with anyio.create_task_group() as tg:
            for _ in range(workers):
                tg.start_soon(ask)
        await anyio.sleep(0.5)  # idle again
        rss = [_status(pid, "VmRSS:") for pid in pids]
        pss = [_status(pid, "Pss:", "smaps_rollup") for pid in pids]
        found[side.name] = (int(statistics.median(rss)), int(statistics.median(pss)), len(pids))
    return found


def _status(pid: int, field_name: str, name: str = "status") -> int:
    """Read one ``kB`` field of ``/proc/<pid>/<name>`` in bytes."""
    for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
        if line.startswith(field_name):
            return int(line.split()[1]) * 1024
    raise LookupError(f"{field_name} not in /proc/{pid}/{name}")


@contextlib.asynccontextmanager
async def all_sides(workers: int, only: Sequence[str] | None = None) -> AsyncIterator[list[Side]]:
    """Every side (or those named in ``only``), started; closed on the way out."""
    makers = {
        "pool": pool_side,
        "held": held_side,
        "anyio": anyio_side,
        "executor": executor_side,
    }
    async with contextlib.AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(make(workers))
            for name, make in makers.items()
            if only is None or name in only
        ]


async def bench(args: argparse.Namespace) -> None:
    """Measure and print."""
    async with all_sides(args.workers, only=args.sides.split(",")) as sides:
        results = await measure(
            sides,
            rounds=args.rounds,
            calls=args.calls,
            cpu_calls=args.cpu_calls,
            workers=args.workers,
        )
        sizes = await memory(sides, args.workers)
    names = [side.name for side in sides]
    baselines = [n for n in ("anyio", "executor") if n in names]
    ours = [n for n in names if n not in baselines] or baselines[:1]
    print(f"{args.workers} workers, {args.rounds} rounds, load {_load()}")
    for line in report(results, ours, baselines):
        print(line)
    print("memory of an idle worker (median): VmRSS / Pss")
    for name, (rss, pss, count) in sizes.items():
        print(f"  {name:<9} {rss / 2**20:6.1f} / {pss / 2**20:5.1f} MiB  ({count} workers)")
    print("target: pool and held >= 1.0x of anyio and of executor (median of paired rounds)")


def report(
    results: dict[tuple[str, int], Line], ours: Sequence[str], baselines: Sequence[str]
) -> Iterator[str]:
    """Yield the table: rates, ratios against each baseline, CPU per call."""
    for (workload, tasks), line in results.items():
        rates = "  ".join(f"{n} {statistics.median(v):,.0f}/s" for n, v in line.rates.items())
        cpu = " | ".join(f"{statistics.median(v) * 1e6:.0f}" for v in line.cpu.values())
        yield f"{workload}, {tasks} in flight: {rates}  CPU us/call {cpu}"
        for mine in ours:
            for base in baselines:
                if base == mine:
                    continue
                ratios = [m / b for m, b in zip(line.rates[mine], line.rates[base], strict=True)]
                spread = f"{min(ratios):.2f}-{max(ratios):.2f}"
                yield f"    {mine} / {base}: {statistics.median(ratios):.2f}x ({spread})"


def _load() -> str:
    return " ".join(f"{v:.1f}" for v in os.getloadavg())


def main() -> None:
    """Parse the flags, measure, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=1000, help="no-op calls per round and side")
    parser.add_argument("--cpu-calls", type=int, default=200, help="10 ms calls per round and side")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--sides", default="pool,held,anyio,executor")
    args = parser.parse_args()
    children_path()
    anyio.run(bench, args)


if __name__ == "__main__":
    main()
