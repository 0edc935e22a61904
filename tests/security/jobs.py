"""The secured pods' job: one statement and one message in the completion's transaction.

``leaseworker run tests.security.jobs:OutboxJob`` listens on ``LW_TEST_TOPIC``
and, in ``ctx.transaction()``, counts its own executions in the store's
database (``leaseworker_completions``, which the runtime role may read) and
publishes ``{"job": <job key>}`` to ``LW_TEST_READY_TOPIC``, so the store
writes the outbox under the pod's role and the relay sends it through the
pod's Kafka principal. A payload with ``"fail": true`` raises instead (the
crash whose traceback the leak test reads, with ``--log-job-errors``).
"""

from __future__ import annotations

import os

from leaseworker import JobContext, ReportJob


class OutboxJob(ReportJob):
    """Writes through the transaction, publishes one message, completes; or fails on demand."""

    topic = os.environ.get("LW_TEST_TOPIC", "unset")
    lease_duration = 5.0

    async def run(self, ctx: JobContext) -> object:
        """Read in the transaction, publish to the ready topic, complete (or raise)."""
        if ctx.trigger.payload.get("fail"):
            raise RuntimeError("the job failed on purpose")
        async with ctx.transaction() as tx:
            rows = await tx.execute("SELECT count(*) FROM leaseworker_completions")
            tx.publish(os.environ["LW_TEST_READY_TOPIC"], {"job": ctx.job_key}, key=ctx.job_key)
            tx.complete({"seen": int(rows[0][0])})
        return None
