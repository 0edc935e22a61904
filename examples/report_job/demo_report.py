"""``MonthlyReport`` as ``leaseworker demo`` runs it: a short lease, and start/stop markers.

The demo checks that no two executions of one report overlapped, so every
execution appends a ``start`` line and a ``stop`` line (with how it ended) to
the file named by ``$LEASEWORKER_DEMO_MARKERS``, stamped with
``time.monotonic()``: one clock for every process on the machine. Without the
variable it is the plain job with a 3-second lease.

``slow_seconds`` in the payload stands for a slow warehouse query before the
aggregation: the report then outlives its lease and keeps it only by renewing.
"""

from __future__ import annotations

import os
import time

import anyio
from monthly_report import MonthlyReport

from leaseworker import JobContext

MARKERS_ENV = "LEASEWORKER_DEMO_MARKERS"


class DemoMonthlyReport(MonthlyReport):
    """MonthlyReport with a 3 s lease (renewed every second) that leaves markers."""

    lease_duration = 3.0
    max_runtime = 60.0

    async def run(self, ctx: JobContext) -> object:
        """Mark the start, wait ``slow_seconds`` with checkpoints, report, mark the stop."""
        _mark(ctx, "start")
        how = "failed"
        try:
            until = time.monotonic() + float(ctx.trigger.payload.get("slow_seconds", 0))
            while (left := until - time.monotonic()) > 0:
                await ctx.checkpoint()
                await anyio.sleep(min(0.1, left))
            result = await super().run(ctx)
        except anyio.get_cancelled_exc_class():
            how = "cancelled" if ctx.owned else "lost"
            raise
        except Exception:
            how = "failed" if ctx.owned else "lost"
            raise
        else:
            how = "completed"
            return result
        finally:
            _mark(ctx, "stop", how)


def _mark(ctx: JobContext, what: str, how: str = "-") -> None:
    """Append one marker line; no payload data, only identities and positions."""
    path = os.environ.get(MARKERS_ENV)
    if not path:
        return
    trigger = ctx.trigger
    line = (
        f"{time.monotonic():.6f} {ctx.pod} {ctx.job_key} {ctx.execution_id} "
        f"{trigger.partition} {trigger.offset} {what} {how}\n"
    )
    with open(path, "a") as markers:
        markers.write(line)
