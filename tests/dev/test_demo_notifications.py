"""The stack demo's notifications line and verdict, on real SQLite files (no services).

The committed messages are read from a real completion store file, what the
receiver did from a database the example receiver's tables shape; the
demo's ``ok`` (its exit code) requires every committed notification
delivered exactly once and nothing notified that was never committed.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import pytest

from leaseworker import CompletionRequest, open_store
from leaseworker._store import Message, effect_store
from leaseworker_dev._demos._notifications import Notifications, tally
from leaseworker_dev._demos._stack_demo import Summary

pytestmark = pytest.mark.fake

TABLES = (  # examples/report_job/ready_receiver.py's
    "CREATE TABLE notification (effect_id TEXT PRIMARY KEY, job_key TEXT, fence INTEGER,"
    " tenant TEXT, period TEXT)",
    "CREATE TABLE dropped (effect_id TEXT, status TEXT, fence INTEGER)",
)


def test_tally_counts_committed_delivered_duplicates_stale_and_what_got_through(
    tmp_path: Path,
) -> None:
    """Two committed, one notified (and redelivered), one stale drop, one never committed."""
    url = f"sqlite:///{tmp_path / 'completions.sqlite3'}"

    async def commit() -> list[str]:
        async with open_store(url) as opened:
            store = effect_store(opened)
            async with store.transaction("ns:{k}", "v1", 3) as tx:
                request = CompletionRequest(
                    job_key="ns:{k}", input_version="v1", fence=3, result=None,
                    execution_id="e3", pod="pod-a",
                )  # fmt: skip
                await tx.commit(request, [Message.build("reports.ready", {"n": n}) for n in (1, 2)])
            return [entry.row.effect_id for entry in await store.outbox_entries()]

    first, _ = anyio.run(commit)
    with sqlite3.connect(tmp_path / "notifications.sqlite3") as conn:
        for table in TABLES:
            conn.execute(table)
        conn.execute(
            "INSERT INTO notification VALUES (?, 'ns:{k}', 3, 'acme', '2026-11')", (first,)
        )
        conn.execute("INSERT INTO notification VALUES ('lw1:x:0', 'ns:{k}', 1, 'acme', '2026-11')")
        conn.execute("INSERT INTO dropped VALUES (?, 'duplicate', 3)", (first,))
        conn.execute("INSERT INTO dropped VALUES ('lw1:y:0', 'stale', 1)")

    async def count() -> Notifications:
        async with open_store(url) as opened:
            return await tally(effect_store(opened), tmp_path)

    counted = anyio.run(count)
    assert counted == Notifications(
        committed=2, delivered_once=1, duplicates=1, stale=1, got_through=1
    )
    assert not counted.ok
    assert counted.line() == (
        "2 committed, 1 delivered once, 1 duplicates, 1 from stale executions "
        "(1 notified without a commit)"
    )


def test_the_demo_fails_unless_each_committed_notification_was_delivered_exactly_once() -> None:
    """Everything else proven: the notifications alone decide the verdict."""
    proven = Summary(triggers=3, completed_triggers=3, committed=3, takeover_after=1.0)
    assert not proven.ok  # no tally: not proven
    good = Notifications(committed=2, delivered_once=2, duplicates=1)
    assert Summary(**{**vars(proven), "notifications": good}).ok
    for bad in (
        Notifications(committed=2, delivered_once=1),
        Notifications(committed=2, delivered_once=2, got_through=1),
        Notifications(),  # nothing committed: the demo's jobs publish, so something broke
    ):
        assert not Summary(**{**vars(proven), "notifications": bad}).ok, bad
    rendered = Summary(**{**vars(proven), "notifications": good}).render()
    assert "  notifications        2 committed, 2 delivered once, 1 duplicates, 0 from stale" in (
        rendered
    )
