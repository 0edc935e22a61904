"""A monthly sales report as a leaseworker job: bounded batches, a checkpoint between them.

Run it (from this directory, with Kafka and Redis reachable)::

    leaseworker run monthly_report:MonthlyReport --group reports
    leaseworker trigger reports.requested --payload '{"tenant": "acme", "period": "2026-11"}'

The job key is ``report:{tenant}:{period}``, so two requests for the same
month never run at once, in one pod or across pods.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from leaseworker import JobContext, MalformedTrigger, ReportJob, Trigger

BATCH_SIZE = 2_000
"""Rows per batch: small enough that a lost lease stops the job within one batch."""

MAX_ROWS = 1_000_000
"""Upper bound on a request's row count: a trigger must not ask for unbounded work."""

REGIONS = ("north", "south", "east", "west")


@dataclass(frozen=True, slots=True)
class Sale:
    """One generated sales row."""

    region: str
    cents: int


class MonthlyReport(ReportJob):
    """Total a tenant's sales for one month, per region."""

    topic = "reports.requested"
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
        # The returned report is recorded by the worker through the fenced
        # completion store (--store-url), still under the lease: a redelivered
        # request is then answered from the store, and a paused pod's late
        # report is refused as stale. (`await ctx.complete(report)` does the
        # same explicitly and returns the store's answer; see README.md.)
        return {
            "job_key": ctx.job_key,
            "fence": ctx.fence,
            "rows": rows,
            "batches": batches,
            "totals_cents": dict(sorted(totals.items())),
        }


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
