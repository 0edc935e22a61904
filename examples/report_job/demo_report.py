"""``MonthlyReport`` as ``leaseworker demo`` runs it: a short lease, and an optional slow start.

``slow_seconds`` in the payload stands for a slow warehouse query before the
aggregation: the report then outlives its 3-second lease and keeps it only by
renewing. ``until_file`` makes that query last until the file exists (the
demo makes it once the stalled pod's report stopped, so that report cannot
finish first, however loaded the machine). The demo judges the run from the
history each pod records (``leaseworker run --record-history``) and from what
the notifications' receiver recorded, not from anything the job returns.
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
        """Wait ``slow_seconds`` and for ``until_file`` with checkpoints, then report."""
        until = time.monotonic() + float(ctx.trigger.payload.get("slow_seconds", 0))
        release = ctx.trigger.payload.get("until_file")
        while (left := until - time.monotonic()) > 0 or (release and not await _exists(release)):
            await ctx.checkpoint()
            await anyio.sleep(min(0.1, max(left, 0.01)))
        return await super().run(ctx)


async def _exists(path: str) -> bool:
    return await anyio.Path(path).exists()
