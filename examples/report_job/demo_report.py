"""``MonthlyReport`` as ``leaseworker demo`` runs it: a short lease, and an optional slow start.

``slow_seconds`` in the payload stands for a slow warehouse query before the
aggregation: the report then outlives its 3-second lease and keeps it only by
renewing. The demo judges the run from the history each pod records
(``leaseworker run --record-history``), not from anything the job writes.
"""

from __future__ import annotations

import time

import anyio
from monthly_report import MonthlyReport

from leaseworker import JobContext


class DemoMonthlyReport(MonthlyReport):
    """MonthlyReport with a 3 s lease (renewed every second) and a slow-query stand-in."""

    lease_duration = 3.0
    max_runtime = 60.0

    async def run(self, ctx: JobContext) -> object:
        """Wait ``slow_seconds`` with checkpoints, then report."""
        until = time.monotonic() + float(ctx.trigger.payload.get("slow_seconds", 0))
        while (left := until - time.monotonic()) > 0:
            await ctx.checkpoint()
            await anyio.sleep(min(0.1, left))
        return await super().run(ctx)
