"""A pod paused inside its transaction: real pods, real PostgreSQL, Redis and Kafka.

Pod A's job writes its row in ``ctx.transaction()`` and then waits inside the
block; the test SIGSTOPs A there (its event loop, its renewals and its
session's client all stop, so only the database can end what A holds). A's
lease is 3 s, the store's timeout 8 s on both pods. Pod B already holds a
trigger of the same job key when A stops (busy on A's lease): it must take
over within A's lease (B's acquire is busy until A's lease expires, then its
claim must not wait for A's head row lock: the server ended A's session at
A's local deadline), not after the store's timeout (before this bound, A's
session lived until its 8 s idle timeout, and B's claim waited behind it).
A, resumed, writes nothing and ends ``lost`` with reason ``loop_blocked``
(its event loop woke past its deadline). About 30 s.

Paused inside a statement (a 10 s ``pg_sleep``, which no bound of the lease's
ends any more: the pod itself would, were it running), A's session is ended
by B: B's claim waits for the head row, looks at who holds it, finds A's
transaction marked with the key and a lower fence, and terminates it. B
commits within A's lease as above, not after A's statement.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import anyio
import psycopg
import pytest

from leaseworker import JobContext, ReportJob
from leaseworker_dev._services import PodProcess

from ..pods import holding
from ..waiting import eventually
from .test_effects_pods import Pods, pg_url, pods  # noqa: F401 (fixtures)

LEASE = "3"
STORE_TIMEOUT = "8"


class InsideJob(ReportJob):
    """Writes its row, marks ``inside <pod> <fence> <time> <backend pid>``, waits, commits.

    Payload ``wait_for``: inside the block, wait until that file exists;
    ``sleep``: then run ``pg_sleep`` that long. Markers also:
    ``committed <pod> <fence> <time>``.
    """

    topic = os.environ.get("LW_TEST_TOPIC", "unset")
    lease_duration = float(os.environ.get("LW_TEST_LEASE", LEASE))

    async def run(self, ctx: JobContext) -> object:
        """One row and one message in one transaction, waiting inside it if asked."""
        version = str(ctx.trigger.payload.get("inputVersion"))
        wait_for = ctx.trigger.payload.get("wait_for")
        async with ctx.transaction() as tx:
            await tx.execute(
                "INSERT INTO report_rows (pod, fence, version) VALUES (%s, %s, %s)",
                (ctx.pod, ctx.fence, version),
            )
            assert isinstance(tx.connection, psycopg.AsyncConnection)
            pid = tx.connection.info.backend_pid
            _mark(f"inside {ctx.pod} {ctx.fence} {time.time()} {pid}")
            if "sleep" in ctx.trigger.payload:
                await tx.execute("SELECT pg_sleep(%s)", (ctx.trigger.payload["sleep"],))
            if isinstance(wait_for, str):
                # Another process creates the file: no in-process event can say so.
                while not os.path.exists(wait_for):  # noqa: ASYNC240, ASYNC110
                    await anyio.sleep(0.02)
            tx.publish(os.environ["LW_TEST_EFFECTS"], {"pod": ctx.pod}, key=ctx.job_key)
            tx.complete({"pod": ctx.pod})
        _mark(f"committed {ctx.pod} {ctx.fence} {time.time()}")
        return None


def _mark(line: str) -> None:
    with open(os.environ["LW_TEST_MARKERS"], "a") as markers:
        markers.write(line + "\n")


async def _waiting_in(pods: Pods, b: PodProcess) -> None:  # noqa: F811
    """Give B its trigger and wait until B holds it (busy on A's lease) before A stops.

    The takeover is then timed from the stop to B's commit: A's lease running
    out, B's next try and its claim, not the trigger's way through Kafka (a
    loaded machine once delivered it 5 s late).
    """
    await pods.send("b", inputVersion="request-b")
    await eventually(lambda: holding(b), within=30)


def _query(url: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql).fetchall()


@pytest.mark.timeout(150)
async def test_a_pod_paused_in_its_transaction_is_taken_over_within_the_lease(
    pods: Pods,  # noqa: F811
    pg_url: str,  # noqa: F811
) -> None:
    """B commits within A's lease after A stopped, not the store's timeout; A writes nothing."""
    go = pods.workdir / "go"
    flags = ("--store-timeout", STORE_TIMEOUT, "--session-timeout", "30")
    job = f"{__name__}:InsideJob"
    a = await pods.spawn("pod-a", "a", *flags, lease=LEASE, job=job)
    b = await pods.spawn("pod-b", "b", *flags, lease=LEASE, job=job)
    await pods.send("a", inputVersion="request-a", wait_for=str(go))
    [[fence_a, _, _]] = await pods.until("inside", "pod-a")
    await _waiting_in(pods, b)
    a.signal(signal.SIGSTOP)
    stopped = time.time()
    [[fence_b, at_b]] = await pods.until("committed", "pod-b", within=40)
    taken_over = float(at_b) - stopped
    print(f"takeover: B committed {taken_over:.2f}s after A stopped (lease {LEASE}s)")
    print(f"A stopped at {time.strftime('%H:%M:%S', time.localtime(stopped))}; B's log:")
    print(b.log_text())  # shown only if an assertion fails: where B's time went
    assert taken_over < float(LEASE) + 2.0 < float(STORE_TIMEOUT)
    assert int(fence_b) > int(fence_a)
    go.touch()
    a.signal(signal.SIGCONT)

    async def a_ended() -> bool:
        return "lost (" in a.log_text()

    await eventually(a_ended, within=20)
    assert "lost (loop_blocked)" in a.log_text()
    assert pods.marks("committed", "pod-a") == []
    assert _query(pg_url, "SELECT pod, fence FROM report_rows") == [("pod-b", int(fence_b))]
    outbox = _query(pg_url, "SELECT fence FROM leaseworker_outbox")
    assert outbox == [(int(fence_b),)]
    assert "completed" in b.log_text()


@pytest.mark.timeout(150)
async def test_a_pod_paused_in_a_long_statement_is_ended_by_the_pod_that_takes_over(
    pods: Pods,  # noqa: F811
    pg_url: str,  # noqa: F811
) -> None:
    """A paused in a 10 s statement: B ends A's session and commits within A's lease."""
    flags = ("--store-timeout", STORE_TIMEOUT, "--session-timeout", "30")
    job = f"{__name__}:InsideJob"
    a = await pods.spawn("pod-a", "a", *flags, lease=LEASE, job=job)
    b = await pods.spawn("pod-b", "b", *flags, lease=LEASE, job=job)
    await pods.send("a", inputVersion="request-a", sleep=10.0)
    [[fence_a, _, pid_a]] = await pods.until("inside", "pod-a")

    async def sleeping() -> bool:
        sql = f"SELECT wait_event FROM pg_stat_activity WHERE pid = {int(pid_a)}"
        return _query(pg_url, sql) == [("PgSleep",)]

    await eventually(sleeping)
    await _waiting_in(pods, b)
    a.signal(signal.SIGSTOP)
    stopped = time.time()
    [[fence_b, at_b]] = await pods.until("committed", "pod-b", within=40)
    taken_over = float(at_b) - stopped
    print(f"takeover: B committed {taken_over:.2f}s after A stopped in its statement")
    assert taken_over < float(LEASE) + 2.0 < 10.0
    assert int(fence_b) > int(fence_a)
    assert _query(pg_url, f"SELECT pid FROM pg_stat_activity WHERE pid = {int(pid_a)}") == []
    assert "ended the session of an older execution" in b.log_text()
    a.signal(signal.SIGCONT)

    async def a_ended() -> bool:
        return "lost (" in a.log_text()

    await eventually(a_ended, within=20)
    assert pods.marks("committed", "pod-a") == []
    assert _query(pg_url, "SELECT pod, fence FROM report_rows") == [("pod-b", int(fence_b))]
    assert _query(pg_url, "SELECT fence FROM leaseworker_outbox") == [(int(fence_b),)]
