"""A monthly sales report as a leaseworker job: bounded batches, a checkpoint between them.

Run it (from this directory, with Kafka and Redis reachable)::

    leaseworker run monthly_report:MonthlyReport --group reports
    leaseworker trigger reports.requested --payload '{"tenant": "acme", "period": "2026-11"}'

The job key is ``report:{tenant}:{period}``, so two requests for the same
month never run at once, in one pod or across pods. The report's row and its
``reports.ready`` notification commit with the completion, in one
transaction of the completion store's database (``ctx.transaction()``): a
superseded execution writes neither. ``ready_receiver.py`` consumes them.
"""

from __future__ import annotations

import hashlib
import json
import random
import sqlite3
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from leaseworker import JobContext, MalformedTrigger, ReportJob, Trigger
from leaseworker.effects import Transaction

BATCH_SIZE = 2_000
"""Rows per batch: small enough that a lost lease stops the job within one batch."""

MAX_ROWS = 1_000_000
"""Upper bound on a request's row count: a trigger must not ask for unbounded work."""

REGIONS = ("north", "south", "east", "west")

REPORT_TABLE = """
    CREATE TABLE IF NOT EXISTS monthly_report (
        job_key TEXT PRIMARY KEY,
        fence   BIGINT NOT NULL,
        rows    INTEGER NOT NULL,
        totals  TEXT NOT NULL
    )
"""
"""The team's own table, in the completion store's database (created on first use)."""

SAVE_REPORT = """
    INSERT INTO monthly_report (job_key, fence, rows, totals) VALUES (%s, %s, %s, %s)
    ON CONFLICT (job_key) DO UPDATE
    SET fence = excluded.fence, rows = excluded.rows, totals = excluded.totals
"""
"""One row per report; a request with new inputs (a new completion) replaces it."""


@dataclass(frozen=True, slots=True)
class Sale:
    """One generated sales row."""

    region: str
    cents: int


class MonthlyReport(ReportJob):
    """Total a tenant's sales for one month, per region."""

    topic = "reports.requested"
    ready_topic = "reports.ready"
    """Where the "report ready" notification goes (``ready_receiver.py`` consumes it)."""
    lease_duration = 30.0
    max_runtime = 600.0

    def job_key(self, trigger: Trigger) -> str:
        """``report:{tenant}:{period}``: one logical report per tenant and month."""
        tenant, period = trigger.payload.get("tenant"), trigger.payload.get("period")
        if not isinstance(tenant, str) or not isinstance(period, str):
            raise MalformedTrigger("no_job_key", "payload needs string 'tenant' and 'period'")
        return f"report:{tenant}:{period}"

    async def run(self, ctx: JobContext) -> object:
        """Aggregate the month's rows batch by batch; stop at the first checkpoint after a loss."""
        rows = int(ctx.trigger.payload.get("rows", 100_000))
        if not 0 < rows <= MAX_ROWS:
            raise ValueError(f"rows must be in 1..{MAX_ROWS}")
        totals: Counter[str] = Counter()
        batches = 0
        for batch in _batches(_sales(ctx.job_key, rows), BATCH_SIZE):
            # LeaseLost here once ownership is uncertain; otherwise it yields to the
            # event loop, so renewals and other jobs run between batches.
            await ctx.checkpoint()
            for sale in batch:
                totals[sale.region] += sale.cents
            batches += 1
        report = {
            "job_key": ctx.job_key,
            "fence": ctx.fence,
            "rows": rows,
            "batches": batches,
            "totals_cents": dict(sorted(totals.items())),
        }
        # One transaction in the completion store's database (--store-url),
        # still under the lease: it first checks no newer execution claimed the
        # key, then holds the key's lock to the commit. The row, the message
        # and the completion commit together or not at all; a paused pod's
        # late report writes nothing (stale) and a redelivered request is
        # answered from the store without running.
        async with ctx.transaction() as tx:
            await tx.execute(REPORT_TABLE)
            totals_json = json.dumps(report["totals_cents"])
            await tx.execute(_sql(tx, SAVE_REPORT), (ctx.job_key, ctx.fence, rows, totals_json))
            tenant, period = ctx.trigger.payload["tenant"], ctx.trigger.payload["period"]
            ready = {"tenant": tenant, "period": period, "fence": ctx.fence}
            tx.publish(self.ready_topic, ready, key=ctx.job_key)
            tx.complete(report)
        return report  # what the transaction recorded (hooks and tests see it too)


def _sql(tx: Transaction, statement: str) -> str:
    """Write ``statement``'s placeholders as the database's driver wants (SQLite: ``?``)."""
    return (
        statement.replace("%s", "?") if isinstance(tx.connection, sqlite3.Connection) else statement
    )


def _sales(job_key: str, rows: int) -> Iterator[Sale]:
    """Generate the month's rows deterministically from the job key (stand-in for a query)."""
    seed = int.from_bytes(hashlib.sha256(job_key.encode()).digest()[:8], "big")
    rng = random.Random(seed)
    for _ in range(rows):
        yield Sale(region=rng.choice(REGIONS), cents=rng.randrange(100, 100_000))


def _batches(rows: Iterator[Sale], size: int) -> Iterator[list[Sale]]:
    batch: list[Sale] = []
    for row in rows:
        batch.append(row)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
