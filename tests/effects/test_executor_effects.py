"""``ctx.transaction()`` through the pod's executor, on real Redis and real PostgreSQL/SQLite.

The job's row, its outbox message and its completion commit together; a
job whose key a newer fence claimed while it ran (a pod paused past its
lease, the newer pod's claim landing meanwhile) writes nothing and ends
``lost (stale)``; a redelivered trigger is answered ``duplicate`` without
running.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from leaseworker import (
    CompletionStore,
    JobContext,
    RedisLeases,
    ReportJob,
    open_store,
)
from leaseworker._execution import Executor, Trigger, completion_key
from leaseworker._store import effect_store
from leaseworker.testing import make_trigger

from ..store.test_store import raw

KEY = "report:acme:2026-11"


class RowJob(ReportJob):
    """Writes ``report`` and publishes ``reports.ready`` in one transaction; may wait first."""

    topic = "reports.requested"
    lease_duration = 5.0

    def __init__(self, url: str) -> None:
        self.sql = "INSERT INTO report (k, fence) VALUES (%s, %s)"
        if url.startswith("sqlite"):
            self.sql = self.sql.replace("%s", "?")
        self.runs = 0
        self.gate: anyio.Event | None = None
        self.waiting = anyio.Event()

    async def run(self, ctx: JobContext) -> object:
        """Wait at the gate (if any), then write, publish and complete in one transaction."""
        self.runs += 1
        if self.gate is not None:
            self.waiting.set()
            await self.gate.wait()
        async with ctx.transaction() as tx:
            await tx.execute(self.sql, (ctx.job_key, ctx.fence))
            tx.publish("reports.ready", {"fence": ctx.fence})
            tx.complete({"fence": ctx.fence})
        return None


@pytest.fixture
async def durable(store_url: str) -> AsyncIterator[tuple[CompletionStore, str]]:
    """A durable store with the job's own table, and its URL."""
    await raw(store_url, "CREATE TABLE report (k text PRIMARY KEY, fence bigint NOT NULL)")
    async with open_store(store_url) as opened:
        yield opened, store_url


def executor(job: ReportJob, leases: RedisLeases, store: CompletionStore, ns: str) -> Executor:
    """The pod's executor on real Redis and ``store``."""
    return Executor(job, leases, pod="pod-a", store=store, store_namespace=ns)


def trigger() -> Trigger:
    """The report request."""
    return make_trigger({"tenant": "acme"}, key=KEY)


async def test_row_message_and_completion_commit_together_and_redelivery_is_a_duplicate(
    durable: tuple[CompletionStore, str], leases: RedisLeases, namespace: str
) -> None:
    """One execution: its row, message and completion; the same trigger again runs nothing."""
    store, url = durable
    job = RowJob(url)
    run = executor(job, leases, store, namespace)
    assert (await run.run(trigger(), KEY)).outcome == "completed"
    rows: list[Any] = await raw(url, "SELECT k, fence FROM report")
    assert [k for k, _ in rows] == [KEY]
    outbox = await effect_store(store).outbox()
    assert [row.fence for row, _ in outbox] == [rows[0][1]]
    found = await store.lookup(completion_key(namespace, KEY), outbox[0][0].input_version)
    assert found is not None
    assert found.result == {"fence": rows[0][1]}
    assert (await run.run(trigger(), KEY)).outcome == "duplicate"
    assert job.runs == 1


async def test_a_newer_claim_while_the_job_ran_makes_its_transaction_write_nothing(
    durable: tuple[CompletionStore, str], leases: RedisLeases, namespace: str
) -> None:
    """A newer fence claims the key while the job waits: its transaction is refused, ``stale``.

    This is what a pod paused past its lease meets when it wakes: the newer
    pod's claim landed first. Nothing is written: no row, no message, no
    completion; the ending is ``lost`` with reason ``stale``, terminal.
    """
    store, url = durable
    job = RowJob(url)
    job.gate = anyio.Event()
    run = executor(job, leases, store, namespace)
    endings = []
    async with anyio.create_task_group() as tg:

        async def go() -> None:
            endings.append(await run.run(trigger(), KEY))

        tg.start_soon(go)
        await job.waiting.wait()
        key = completion_key(namespace, KEY)
        claim = await store.claim(key, "newer-request", 2**62)
        assert claim.status == "claimed"
        job.gate.set()
    (ending,) = endings
    assert (ending.outcome, ending.reason, ending.terminal) == ("lost", "stale", True)
    assert await raw(url, "SELECT count(*) FROM report") == [(0,)]
    assert await effect_store(store).outbox() == []
