"""A report whose ``ctx.transaction()`` takes 1, 10 and 60 s on a 10 s lease, on PostgreSQL.

The report pod runs one trigger whose block sends ``T`` statements of one
second each (``pg_sleep(1)``, then its row) while its lease (10 s) renews;
``--single`` adds reports whose block is one statement of ``T`` seconds
(longer than the lease's validity: it lasts while the lease renews, see
docs/effects.md). Beside it, the other pod (its own store pool, the same
Redis) runs short transactions (a row each) on other job keys, ``--others``
at a time. Per report: its outcome, whether it committed, its renewals, its
time; the other pod's completions per second while the report ran, divided
by its rate in a window of the same length just before, alone (the
baseline, measured in the same run). Both pods are executors in this one
process, on one event loop: the report only waits on the server.

    .venv/bin/python bench/long_transactions.py [--seconds 1,10,60] [--single 10,60]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import os
import time
from dataclasses import dataclass, field

import anyio
import psycopg
from redis.asyncio import Redis

from leaseworker import JobContext, RedisLeases, ReportJob, open_store
from leaseworker._events import Event, ExecutionEvent, LeaseEvent
from leaseworker._execution import Ending, Executor
from leaseworker.testing import make_trigger
from leaseworker_dev._services import LocalStack

LEASE = 10.0


class Report(ReportJob):
    """Run payload ``statements`` times ``pg_sleep(seconds)`` in one transaction, then its row."""

    topic = "reports.requested"
    lease_duration = LEASE

    async def run(self, ctx: JobContext) -> object:
        """Run the block: the statements, the row, the result."""
        payload = ctx.trigger.payload
        async with ctx.transaction() as tx:
            for _ in range(int(payload["statements"])):
                await tx.execute("SELECT pg_sleep(%s)", (float(payload["seconds"]),))
            await tx.execute("INSERT INTO report (k) VALUES (%s)", (ctx.job_key,))
            tx.complete({"k": ctx.job_key})
        return None


class Short(ReportJob):
    """One row in one transaction."""

    topic = "reports.requested"
    lease_duration = LEASE

    async def run(self, ctx: JobContext) -> object:
        """Write the row and the result."""
        async with ctx.transaction() as tx:
            await tx.execute("INSERT INTO report (k) VALUES (%s)", (ctx.job_key,))
            tx.complete(None)
        return None


@dataclass
class Counts:
    """What the hooks saw: the report's renewals and executions, the other pod's completions."""

    renewals: int = 0
    executions: list[tuple[str | None, str | None]] = field(default_factory=list)
    done: int = 0

    def report(self, event: Event) -> None:
        """Count the report's renewals and its executions' endings."""
        if isinstance(event, LeaseEvent) and event.name == "renewed":
            self.renewals += 1
        if isinstance(event, ExecutionEvent) and event.event == "finished":
            self.executions.append((event.outcome, event.reason))

    def other(self, event: Event) -> None:
        """Count the other pod's completed executions."""
        if isinstance(event, ExecutionEvent) and event.event == "finished":
            self.done += event.outcome == "completed"


async def _others(executor: Executor, at_once: int, keys: itertools.count[int]) -> None:
    """Run short triggers on fresh job keys, ``at_once`` at a time, until cancelled."""

    async def lane() -> None:
        while True:
            key = f"other:{next(keys)}"
            await executor.run(make_trigger({}, key=key), key)

    async with anyio.create_task_group() as tg:
        for _ in range(at_once):
            tg.start_soon(lane)


async def _one(
    redis: Redis, url: str, seconds: float, statements: int, args: argparse.Namespace, n: int
) -> str:
    """Measure one report; return its line."""
    counts = Counts()
    leases = RedisLeases(redis, namespace=f"bench{n}")
    async with open_store(url) as report_store, open_store(url) as other_store:
        report = Executor(Report(), leases, pod="report", store=report_store, hooks=[counts.report])
        other = Executor(Short(), leases, pod="other", store=other_store, hooks=[counts.other])
        keys = itertools.count(n * 10_000_000)
        window = seconds * statements
        async with anyio.create_task_group() as tg:
            tg.start_soon(_others, other, args.others, keys)
            await anyio.sleep(1.0)  # warm
            counts.done, begun = 0, time.monotonic()
            await anyio.sleep(window)
            baseline = counts.done / (time.monotonic() - begun)
            counts.done, begun = 0, time.monotonic()
            key = f"report:{n}"
            trigger = make_trigger({"seconds": seconds, "statements": statements}, key=key)
            ending: Ending = await report.run(trigger, key)
            took = time.monotonic() - begun
            during = counts.done / took
            tg.cancel_scope.cancel()
    shape = f"{statements} x {seconds:g} s" if statements > 1 else f"one {seconds:g} s statement"
    endings = ", ".join(f"{o} ({r})" if r else str(o) for o, r in counts.executions)
    load = os.getloadavg()[0]
    return (
        f"{shape}: {ending.outcome}{f' ({ending.reason})' if ending.reason else ''} "
        f"in {took:.1f} s; executions: {endings}; renewals {counts.renewals}; "
        f"other pod {during:.0f}/s vs {baseline:.0f}/s alone: {during / baseline:.2f}x "
        f"(load {load:.1f})"
    )


async def bench(redis_url: str, url: str, args: argparse.Namespace) -> None:
    """Every report of ``--seconds`` and ``--single``, one after another."""
    async with contextlib.AsyncExitStack() as stack:
        redis = Redis.from_url(redis_url)
        stack.push_async_callback(redis.aclose)
        runs = [(1.0, int(s)) for s in args.seconds.split(",") if s]
        runs += [(float(s), 1) for s in args.single.split(",") if s]
        for n, (seconds, statements) in enumerate(runs):
            print(await _one(redis, url, seconds, statements, args, n), flush=True)


def main() -> None:
    """Start Redis and PostgreSQL, run the reports, stop them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", default="1,10,60", help="blocks of N one-second statements")
    parser.add_argument("--single", default="", help="blocks of one N-second statement")
    parser.add_argument("--others", type=int, default=8, help="the other pod's triggers at once")
    args = parser.parse_args()
    for noisy in ("psycopg", "psycopg.pool"):  # the other pod's lanes cancelled at each end
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    with LocalStack() as services:
        services.start("redis", "postgres")
        url = services.postgres.create_database("long_transactions")
        with psycopg.connect(url) as conn:
            conn.execute("CREATE TABLE report (k text NOT NULL)")
        anyio.run(bench, services.redis.url, url, args)


if __name__ == "__main__":
    main()
