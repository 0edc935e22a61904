"""The job ``bench/chaos.py`` runs its campaigns against: a report with a 6 s lease.

Like the example ``MonthlyReport`` (batches of generated rows, a checkpoint
between them), keyed by the record key, but with a short lease so that faults
sized by the lease (pauses, stalls, black-holes) play out in seconds and a
thousand of them fit in half an hour. Each batch also waits 30 ms, as a query
would, so a job runs for 1.5 to 7.5 s: longer than a renewal interval, so a
fault can take its lease mid-run. Each completion publishes one message
(``bench.chaos.done``, keyed by the job key) through the outbox, so the
campaigns check the effects too.

``CrunchReport`` is the same report with its work CPU-bound: after a few
query-like waits it computes for 1 to 5 s through ``ctx.run_in_process``
(``leaseworker_dev._services.crunch``: a loop that never awaits nor checks
its lease, in a child process that starts a grandchild), both marking the
execution's marks file, so the campaign checks that no process of an
execution ran after it stopped.
"""

from __future__ import annotations

import hashlib
import random

import anyio

from leaseworker import JobContext, ReportJob
from leaseworker_dev._services import crunch, marks_file

BATCH = 2_000
QUERY_SECONDS = 0.03
DONE_TOPIC = "bench.chaos.done"
ROWS_PER_SECOND = 100_000
"""``CrunchReport`` computes for ``rows / ROWS_PER_SECOND`` seconds."""


class ShortLeaseReport(ReportJob):
    """Total generated sales rows for one key; a 6 s lease, renewed every 2 s."""

    topic = "bench.chaos.requested"
    lease_duration = 6.0
    max_runtime = 120.0

    async def run(self, ctx: JobContext) -> object:
        """Sum ``rows`` generated rows in batches (checking the lease between), publish the sum."""
        rows = min(int(ctx.trigger.payload.get("rows", 100_000)), 1_000_000)
        seed = int.from_bytes(hashlib.sha256(ctx.job_key.encode()).digest()[:8], "big")
        rng = random.Random(seed)
        total = 0
        for start in range(0, rows, BATCH):
            await ctx.checkpoint()
            total += sum(rng.randrange(100, 100_000) for _ in range(min(BATCH, rows - start)))
            await anyio.sleep(QUERY_SECONDS)
        ctx.publish(DONE_TOPIC, {"rows": rows, "total_cents": total}, key=ctx.job_key)
        return {"rows": rows, "total_cents": total, "fence": ctx.fence}


class CrunchReport(ShortLeaseReport):
    """The report's work in a child process that never awaits (6 s lease, as above)."""

    async def run(self, ctx: JobContext) -> object:
        """Wait as five queries would, compute ``rows / 100,000`` s in a child, publish."""
        rows = min(int(ctx.trigger.payload.get("rows", 100_000)), 1_000_000)
        for _ in range(5):
            await ctx.checkpoint()
            await anyio.sleep(QUERY_SECONDS)
        seconds = rows / ROWS_PER_SECOND
        marks = marks_file(ctx.execution_id)
        total = await ctx.run_in_process(crunch, seconds, marks, True)
        ctx.publish(DONE_TOPIC, {"rows": rows, "total_cents": total}, key=ctx.job_key)
        return {"rows": rows, "total_cents": total, "fence": ctx.fence}
