"""Many leases held at once by one pod process: memory, renewal CPU, renewals per round trip.

Each size runs in a fresh process of its own (so memory freed by a smaller
size cannot hide a larger one's), against one private redis-server. The
process holds ``N`` leases with :func:`~leaseworker.hold` around a body that
waits (a long I/O-bound job), all on one :class:`~leaseworker.RedisLeases`
with auto-pipelining, renewing at the default ``lease_duration / 3``. Acquisitions are
spread evenly over one renewal interval, so renewals arrive at a steady rate
(``N / (lease_duration / 3)`` per second) as on a pod whose jobs started at random
times, not in one burst that would batch perfectly.

Once all ``N`` are held and each renewed once, the process measures over
``--periods`` renewal intervals: its CPU time (all of it is renewing: the
bodies are asleep) as a share of one core, the renewals confirmed, and the
Redis round trips (packed writes on its connections, counted by a
``connection_class``). Memory per held lease is
the growth of the process's resident set from before the first acquire to
all ``N`` held and renewing, divided by ``N``; it includes each body's own
task, as a job's would. Then every job ends in one loop turn (the end
burst): the bench reports how long until every block was left (its release
answered), the CPU per ending job, the event loop's lag meanwhile (a probe
sleeping 5 ms at a time), and the releases that failed. Every size runs
``--rounds`` times, sizes interleaved.

    .venv/bin/python bench/held_leases.py [--sizes 100,1000,10000] [--lease-duration 30]
        [--periods 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import anyio
from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.connection import Connection

from leaseworker import HeldLease, LeaseLost, LeaseUnavailable, RedisLeases, hold
from leaseworker._cli._run_command import tune_garbage_collector
from leaseworker_dev._services import LocalRedis

LAG_PROBE = 0.005
"""How often the loop-lag probe wakes during the end burst, in seconds."""


class Collections:
    """The garbage collector's pauses (every generation), from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []  # (generation, seconds)
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        """Time each collection (a ``gc.callbacks`` entry)."""
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._began))


class Ended:
    """Counts the jobs that ended; ``all`` is set, and ``last`` read, when every one did."""

    def __init__(self, count: int) -> None:
        self.all = anyio.Event()
        self.last = 0.0
        self._left = count

    def left(self) -> None:
        """One job left its block (its release answered, or it was lost)."""
        self._left -= 1
        self.last = time.perf_counter()
        if not self._left:
            self.all.set()


class CountingConnection(Connection):
    """A redis-py connection that counts its packed writes: one per round trip."""

    trips = 0

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        """Count, then send as redis-py does."""
        CountingConnection.trips += 1
        await super().send_packed_command(command, check_health)


def resident_bytes() -> int:
    """Return the process's resident set size, from ``/proc/self/statm``."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def hold_many(url: str, count: int, lease_duration: float, periods: float) -> dict[str, Any]:
    """Hold ``count`` leases, measure one steady stretch of renewals, release them all."""
    pool = ConnectionPool.from_url(url, connection_class=CountingConnection, socket_timeout=None)
    redis = Redis.from_pool(pool)
    leases = RedisLeases(redis, namespace=f"held{count}")
    every = lease_duration / 3
    held: list[HeldLease] = []
    end = anyio.Event()  # every job ends at once: the end burst
    ended = Ended(count)

    all_held = anyio.Event()
    unavailable = 0  # acquires that got no answer in time (retried, as a worker would)

    async def job(i: int) -> None:
        try:
            await attempts(i)
        finally:
            ended.left()

    async def attempts(i: int) -> None:
        nonlocal unavailable
        await anyio.sleep(i * every / count)  # spread: renewals then come at a steady rate
        while True:
            try:
                await body(i)
            except LeaseLost:
                return  # counted from its outcome
            except LeaseUnavailable:
                unavailable += 1
                await anyio.sleep(0.1)
            else:
                return

    async def body(i: int) -> None:
        async with hold(leases, f"report:{i}", lease_duration=lease_duration) as lease:
            held.append(lease)
            if len(held) == count:
                all_held.set()
            await end.wait()

    gc.collect()
    collections = Collections()
    gc.callbacks.append(collections)
    before = resident_bytes()
    async with anyio.create_task_group() as tg:
        for i in range(count):
            tg.start_soon(job, i)
        await all_held.wait()
        await anyio.sleep(every)  # every lease renewed once
        # No gc.collect() here: with 10,000 leases held a full collection blocks the
        # loop for about 0.4 s, and renewals in flight then time out.
        memory = resident_bytes() - before
        renewed = sum(h.renewals for h in held)
        trips, cpu, started = CountingConnection.trips, time.process_time(), time.perf_counter()
        await anyio.sleep(periods * every)
        seconds = time.perf_counter() - started
        cpu = time.process_time() - cpu
        trips = CountingConnection.trips - trips
        renewed = sum(h.renewals for h in held) - renewed
        lost_held = sum(h.loss_reason is not None for h in held)  # before the releases
        end_cpu, end_began, lags = await end_burst(end, ended.all)
    end_seconds = ended.last - end_began
    await redis.aclose()
    gc.callbacks.remove(collections)
    full = [seconds for generation, seconds in collections.pauses if generation == 2]
    lost = [h.loss_reason for h in held if h.outcome != "completed"]
    return {
        "held": count,
        "bytes_per_lease": memory / count,
        "core_share": cpu / seconds,
        "renewals_per_second": renewed / seconds,
        "cpu_us_per_renewal": cpu / max(renewed, 1) * 1e6,
        "renewals_per_trip": renewed / max(trips, 1),
        "lost": len(lost),
        "lost_while_held": lost_held,
        "loss_reasons": ",".join(sorted({str(reason) for reason in lost})),
        "unavailable": unavailable,
        "full_collections": len(full),
        "longest_pause": max((seconds for _, seconds in collections.pauses), default=0.0),
        "longest_by_generation": [
            max((s for g, s in collections.pauses if g == generation), default=0.0)
            for generation in range(3)
        ],
        "end_seconds": end_seconds,
        "end_cpu_us_per_lease": end_cpu / count * 1e6,
        "end_lag_p99": lags[min(len(lags) - 1, int(len(lags) * 0.99))] if lags else 0.0,
        "end_lag_max": lags[-1] if lags else 0.0,
        "release_failed": sum(h.release_error is not None for h in held),
        "release_errors": ",".join(
            sorted({type(h.release_error).__name__ for h in held if h.release_error is not None})
        ),
    }


async def end_burst(end: anyio.Event, all_ended: anyio.Event) -> tuple[float, float, list[float]]:
    """End every job in one loop turn; return CPU seconds, its start and the loop lags.

    The CPU is until all ended, the start a ``perf_counter`` reading, the lags sorted.
    """
    lags: list[float] = []
    async with anyio.create_task_group() as probe:
        probe.start_soon(probe_lag, lags)
        cpu, began = time.process_time(), time.perf_counter()
        end.set()
        await all_ended.wait()
        probe.cancel_scope.cancel()
    return time.process_time() - cpu, began, sorted(lags)


async def probe_lag(lags: list[float]) -> None:
    """Append how late each :data:`LAG_PROBE` sleep woke, until cancelled.

    Cancelled with the task group once every job ended: it measures the end burst.
    """
    while True:
        asleep = time.perf_counter()
        await anyio.sleep(LAG_PROBE)
        lags.append(time.perf_counter() - asleep - LAG_PROBE)


def one_size(
    url: str, count: int, lease_duration: float, periods: float, *, gc_tuning: bool
) -> None:
    """Run one size in this process and print its figures as one JSON line.

    With ``gc_tuning`` the collector is tuned as ``leaseworker run`` tunes it.
    """
    if gc_tuning:
        tune_garbage_collector()
    print(json.dumps(anyio.run(hold_many, url, count, lease_duration, periods)))


def main() -> None:
    """Start a private redis-server, run every size in a process of its own, print a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--lease-duration", type=float, default=30.0)
    parser.add_argument("--periods", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-gc-tuning", action="store_true")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child: one size
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one_size(
            args.url, args.one, args.lease_duration, args.periods, gc_tuning=not args.no_gc_tuning
        )
        return
    sizes = [int(size) for size in args.sizes.split(",")]
    runs: dict[int, list[dict[str, Any]]] = {size: [] for size in sizes}
    server = LocalRedis.start()
    try:
        for _ in range(args.rounds):
            for size in sizes:
                child = [sys.executable, __file__, "--one", str(size), "--url", server.url]
                child += [
                    "--lease-duration",
                    str(args.lease_duration),
                    "--periods",
                    str(args.periods),
                ]
                child += ["--no-gc-tuning"] if args.no_gc_tuning else []
                out = subprocess.run(child, check=True, stdout=subprocess.PIPE, text=True).stdout
                runs[size].append(json.loads(out.splitlines()[-1]))
    finally:
        server.stop()
    print(
        f"lease_duration {args.lease_duration:g} s, renewing every "
        f"{args.lease_duration / 3:g} s; median of {args.rounds} runs (lowest-highest)"
    )
    print(
        f"{'held':>6}  {'KB/lease':>9}  {'% of a core':>16}  {'renewals/s':>10}  "
        f"{'us CPU/renewal':>14}  {'renewals/trip':>13}  lost (while held)  retried  "
        "full GCs  longest GC ms  why lost"
    )
    for size, results in runs.items():
        print(
            f"{size:>6}  {_median(results, 'bytes_per_lease') / 1024:>9.1f}  "
            f"{_quartiles(results, 'core_share', 100):>16}  "
            f"{_median(results, 'renewals_per_second'):>10.0f}  "
            f"{_median(results, 'cpu_us_per_renewal'):>14.0f}  "
            f"{_median(results, 'renewals_per_trip'):>13.2f}  "
            f"{sum(int(r['lost']) for r in results):>4} "
            f"{'(' + str(sum(int(r['lost_while_held']) for r in results)) + ')':>12}  "
            f"{sum(int(r['unavailable']) for r in results):>7}  "
            f"{sum(int(r['full_collections']) for r in results):>8}  "
            f"{max(r['longest_pause'] for r in results) * 1000:>13.0f}  "
            f"{','.join(sorted({r['loss_reasons'] for r in results} - {''}))}"
        )
    print("target at 10,000: <= 20 % of one core and <= 10 KB per lease")
    print("end burst: every job ends in one loop turn")
    print(
        f"{'held':>6}  {'ms to release all':>20}  {'us CPU per end':>20}  "
        f"{'loop lag p99 ms':>20}  {'lag max ms':>10}  release failed  why"
    )
    for size, results in runs.items():
        print(
            f"{size:>6}  {_quartiles(results, 'end_seconds', 1000, 0):>20}  "
            f"{_quartiles(results, 'end_cpu_us_per_lease', 1, 0):>20}  "
            f"{_quartiles(results, 'end_lag_p99', 1000, 0):>20}  "
            f"{max(r['end_lag_max'] for r in results) * 1000:>10.0f}  "
            f"{sum(int(r['release_failed']) for r in results):>14}  "
            f"{','.join(sorted({r['release_errors'] for r in results} - {''}))}"
        )


def _median(results: list[dict[str, Any]], name: str) -> float:
    return float(statistics.median(r[name] for r in results))


def _quartiles(results: list[dict[str, Any]], name: str, scale: float, digits: int = 1) -> str:
    """Median with the lowest and highest run, e.g. ``4.1 (3.9-4.4)``."""
    values = sorted(r[name] * scale for r in results)
    low, mid, high = values[0], statistics.median(values), values[-1]
    return f"{mid:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


if __name__ == "__main__":
    main()
