"""A report whose work never awaits: the totals are crunched in a child process.

``SalesReport`` groups one tenant's sales of one month by region and sums
them, in pure Python (as pandas or NumPy code would: no ``await`` for the
whole computation). ``ctx.run_in_process`` runs :func:`crunch` in one of the
pod's process workers; if ownership of the lease becomes uncertain while it
computes, the worker's process group is killed at once, before another pod
can take the report over, so two computations never overlap.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import ClassVar

from leaseworker import JobContext, MalformedTrigger, ProcessContext, ReportJob, Trigger

REGIONS = ("north", "south", "east", "west")
CHECK_EVERY = 50_000
"""Rows between two looks at the lease: optional, it only lets a lost child stop cleanly."""


class SalesReport(ReportJob):
    """Totals per region, one report per ``sales:{tenant}:{period}``."""

    topic: ClassVar[str] = "sales.requested"
    lease_duration: ClassVar[float] = 30.0
    max_runtime: ClassVar[float | None] = 600.0

    def job_key(self, trigger: Trigger) -> str:
        """``sales:{tenant}:{period}``: one computation per tenant and month at a time."""
        payload = trigger.payload
        if not isinstance(payload.get("tenant"), str) or not isinstance(payload.get("period"), str):
            raise MalformedTrigger("no_job_key", "a sales request names a tenant and a period")
        return f"sales:{payload['tenant']}:{payload['period']}"

    async def run(self, ctx: JobContext) -> object:
        """Crunch in a child, then return the totals (recorded through the fenced store)."""
        payload = ctx.trigger.payload
        rows = int(payload.get("rows", 200_000))
        totals = await ctx.run_in_process(crunch, payload["tenant"], payload["period"], rows)
        return {"totals_cents": totals, "rows": rows, "fence": ctx.fence}


def crunch(pctx: ProcessContext, tenant: str, period: str, rows: int) -> dict[str, int]:
    """Sum ``rows`` sales (made up, the same for the same tenant and month) by region."""
    sales = random.Random(f"{tenant}:{period}")
    totals: defaultdict[str, int] = defaultdict(int)
    for row in range(rows):
        if row % CHECK_EVERY == 0:
            pctx.checkpoint()  # LeaseLost once the lease is not certainly ours
        totals[REGIONS[sales.randrange(len(REGIONS))]] += sales.randrange(100, 100_000)
    return dict(sorted(totals.items()))
