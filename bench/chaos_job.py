"""The job ``bench/chaos.py`` runs its campaigns against: a report with a 6 s lease.

Like the example ``MonthlyReport`` (batches of generated rows, a checkpoint
between them), keyed by the record key, but with a short lease so that faults
sized by the lease (pauses, stalls, black-holes) play out in seconds and a
thousand of them fit in half an hour. Each batch also waits 30 ms, as a query
would, so a job runs for 1.5 to 7.5 s: longer than a renewal interval, so a
fault can take its lease mid-run. Each completion publishes one message
(``bench.chaos.done``, keyed by the job key) through the outbox, so the
campaigns check the effects too.
"""

from __future__ import annotations

import hashlib
import random

import anyio

from leaseworker import JobContext, ReportJob

BATCH = 2_000
QUERY_SECONDS = 0.03
DONE_TOPIC = "bench.chaos.done"


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
