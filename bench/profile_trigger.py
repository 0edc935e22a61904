"""Where a pod's time per trigger goes, by box: calls and CPU for each completion store.

The pod side of ``bench/throughput.py`` (same no-op job, topic, services and
concurrency), per store named in ``--stores``:

- one plain round: CPU per trigger of the event-loop thread and of every
  other thread (the SQLite store's fsync thread, the store's worker
  threads), from ``/proc`` (``telemetry_overhead.CpuClock``), with its polls,
  records per poll and store batches per trigger (SQLite, PostgreSQL);
- one round under ``cProfile`` timed by the loop thread's CPU clock: calls
  per trigger and the share of profiled CPU by box, which scales the loop's
  plain CPU into microseconds per box. A built-in function's calls and time count for
  the box of the Python function that called it (``sqlite3`` statements
  for the store, socket sends for whoever sent).

Boxes, by the code's module: ``source`` (the Kafka source, aiokafka),
``worker`` (the pod's dispatch, per-key serialisation, offsets),
``executor`` (executions, retries, outcomes), ``lease`` (leases, redis-py),
``store`` (completion stores, sqlite3, psycopg), ``telemetry`` (the event
seam and its observers, OpenTelemetry), ``logging``, ``loop`` (asyncio,
anyio) and ``other``. The profiler slows Python calls about twice, so its
shares are approximate; ``telemetry_overhead.py --count-calls`` counts every
thread's calls for telemetry on and off.

    .venv/bin/python bench/profile_trigger.py [--triggers 2000] [--concurrency 16]
        [--stores memory,sqlite,postgresql] [--dump DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
from telemetry_overhead import CpuClock
from throughput import PARTITIONS, leaseworker_pod, produce, store_urls

from leaseworker._kafka._trigger_source import KafkaTriggerSource
from leaseworker._lease._trips import OwnConnection
from leaseworker._store._group_commit import Batcher
from leaseworker_dev._services import LocalRedis
from leaseworker_dev._services._kafka import LocalKafka
from leaseworker_dev._services._local_stack import LocalStack

BOXES = (
    ("store", ("/leaseworker/_store/", "/psycopg/", "/psycopg_pool/", "sqlite3")),
    ("lease", ("/leaseworker/_lease/", "/redis/")),
    ("executor", ("/leaseworker/_execution/", "/leaseworker/_retry", "/leaseworker/_outcome")),
    ("worker", ("/leaseworker/_worker/",)),
    ("source", ("/leaseworker/_kafka/", "/aiokafka/", "/kafka/")),
    ("telemetry", ("/leaseworker/_events/", "/leaseworker/_telemetry/", "/opentelemetry/")),
    ("logging", ("/logging/",)),
    ("loop", ("/asyncio/", "/anyio/", "selectors", "/sniffio/", "'_asyncio.", "'select.")),
)
"""Box names with the path fragments (or built-in names) of their code; first match wins."""


COUNTS: Counter[str] = Counter()
"""Polls, the records they carried, store batches and lease trips, counted by the wrappers below."""


def count_polls_and_batches() -> None:
    """Wrap the source's polls, the batcher's runs and the lease trips, to count them."""
    take, run_answered = KafkaTriggerSource._take, Batcher._run_answered
    trip = OwnConnection.trip

    def counted_take(self: KafkaTriggerSource, batch: Any, free: int) -> Any:
        COUNTS["polls"] += 1
        COUNTS["records"] += sum(len(records) for records in batch.values())
        return take(self, batch, free)

    async def counted_run(self: Batcher, batch: list[Any]) -> None:
        COUNTS["batches"] += 1
        COUNTS["calls"] += len(batch)
        await run_answered(self, batch)

    async def counted_trip(self: OwnConnection, commands: Any, wait: Any) -> Any:
        COUNTS["trips"] += 1
        COUNTS["commands"] += len(commands)
        return await trip(self, commands, wait)

    KafkaTriggerSource._take = counted_take  # type: ignore[method-assign]
    Batcher._run_answered = counted_run  # type: ignore[method-assign]
    OwnConnection.trip = counted_trip  # type: ignore[method-assign]


def box_of(where: str) -> str:
    """Return the box of a function's file name (or a built-in's name)."""
    for box, parts in BOXES:
        if any(part in where for part in parts):
            return box
    return "other"


Func = tuple[str, int, str]


def by_box(profile: cProfile.Profile) -> tuple[Counter[str], dict[str, float]]:
    """Return calls and own time (seconds) per box; built-ins count for their callers' boxes."""
    stats: dict[Func, tuple[int, int, float, float, dict[Func, tuple[int, int, float, float]]]]
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    calls: Counter[str] = Counter()
    seconds: dict[str, float] = {}
    for (filename, _, name), (_, ncalls, tottime, _, callers) in stats.items():
        if filename != "~" or not callers:  # Python code, or a built-in nobody profiled called
            box = box_of(filename if filename != "~" else name)
            calls[box] += ncalls
            seconds[box] = seconds.get(box, 0.0) + tottime
            continue
        for (caller_file, _, caller_name), (_, caller_calls, caller_time, _) in callers.items():
            box = box_of(caller_file if caller_file != "~" else caller_name)
            if box_of(name) == "store":  # sqlite3's C calls: the store's, whoever called them
                box = "store"
            calls[box] += caller_calls
            seconds[box] = seconds.get(box, 0.0) + caller_time
    return calls, seconds


async def one_pod(kafka: LocalKafka, redis: LocalRedis, url: str, args: argparse.Namespace) -> None:
    """Run the pod side once on a fresh topic of ``args.triggers`` triggers."""
    topic = f"profile-{uuid.uuid4().hex[:8]}"
    kafka.create_topics([topic], partitions=PARTITIONS)
    await produce(kafka.bootstrap_servers, topic, args.triggers)
    await leaseworker_pod(
        kafka.bootstrap_servers, redis.url, topic, args.triggers, args.concurrency, url
    )


async def profile(
    kafka: LocalKafka, redis: LocalRedis, urls: dict[str, str], args: argparse.Namespace
) -> None:
    """Print, per store, the plain CPU per trigger and its split by box."""
    clock = CpuClock({})
    for store, url in urls.items():
        if store.startswith("bare-"):
            continue
        await one_pod(kafka, redis, url, argparse.Namespace(**{**vars(args), "triggers": 300}))
        before, started = clock.read(), time.perf_counter()
        COUNTS.clear()
        await one_pod(kafka, redis, url, args)
        wall = time.perf_counter() - started
        after = clock.read()
        counts = COUNTS.copy()  # the plain round's (the profiled round counts too)
        polls, batches = counts["polls"], counts["batches"]
        main, other = (
            (after[name] - before[name]) / args.triggers * 1e6 for name in ("pod main", "pod other")
        )
        profiler = cProfile.Profile(time.thread_time_ns, 1e-9)  # CPU, not time waiting in epoll
        profiler.enable()
        await one_pod(kafka, redis, url, args)
        profiler.disable()
        if args.dump:
            profiler.dump_stats(Path(args.dump) / f"{store}.pstats")
        calls, seconds = by_box(profiler)
        total = sum(seconds.values())
        print(
            f"\n{store}: {args.triggers / wall:.0f} triggers/s (plain round, start-up included); "
            f"CPU per trigger: loop thread {main:.0f} µs, other threads {other:.0f} µs\n"
            f"  {polls} polls ({counts['records'] / max(polls, 1):.1f} records each); "
            f"{batches / args.triggers:.2f} store batches per trigger "
            f"({counts['calls'] / max(batches, 1):.1f} calls each); "
            f"{counts['trips'] / args.triggers:.2f} lease trips per trigger "
            f"({counts['commands'] / max(counts['trips'], 1):.1f} commands each)"
        )
        print(f"  {'box':10s} {'calls/trigger':>14s} {'share':>6s} {'µs/trigger':>11s}")
        for box, spent in sorted(seconds.items(), key=lambda item: -item[1]):
            share = spent / total
            print(
                f"  {box:10s} {calls[box] / args.triggers:14.0f} {share:6.1%} {share * main:11.0f}"
            )
        print(f"  {'all':10s} {sum(calls.values()) / args.triggers:14.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--triggers", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--stores", default="memory,sqlite,postgresql")
    parser.add_argument("--dump", help="also write each store's profile (pstats) to this directory")
    args = parser.parse_args()
    stores = [name for name in args.stores.split(",") if name]
    count_polls_and_batches()
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lw-profile-")))
        services = stack.enter_context(LocalStack())
        services.start("redis", "kafka")
        urls = store_urls(services, stores, workdir)
        anyio.run(profile, services.kafka, services.redis, urls, args)


if __name__ == "__main__":
    main()
