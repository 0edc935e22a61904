"""The stack demo's notifications: the example receiver's process, and what it proves.

Every completed report commits one ``reports.ready`` message with its
completion; the pods' relays send them and ``ready_receiver.py`` (the
example receiver, a process of its own with its own SQLite file) records
each effect once through its inbox. :func:`tally` reads both sides: the
committed messages from the completion store, the notifications and the
dropped redeliveries from the receiver's database.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path

import anyio

from leaseworker.toolkit import EffectStore, effect_store, open_store

from .._services import PodProcess

READY_TOPIC = "reports.ready"  # MonthlyReport.ready_topic
RECEIVER_SCRIPT = "ready_receiver.py"


@dataclass(frozen=True, slots=True)
class Notifications:
    """Committed messages against what the receiver did with them."""

    committed: int = 0  # messages in the completion store's outbox (accepted completions only)
    delivered_once: int = 0  # committed messages the receiver notified, each once
    duplicates: int = 0  # redeliveries the receiver's inbox dropped
    stale: int = 0  # effects of superseded executions the inbox dropped
    got_through: int = 0  # notifications of no committed message: must never happen

    @property
    def ok(self) -> bool:
        """Every committed message notified exactly once, nothing else notified."""
        return self.delivered_once == self.committed > 0 and self.got_through == 0

    def line(self) -> str:
        """Return the summary's line: ``13 committed, 13 delivered once, 0 duplicates, ...``."""
        through = f" ({self.got_through} notified without a commit)" if self.got_through else ""
        return (
            f"{self.committed} committed, {self.delivered_once} delivered once, "
            f"{self.duplicates} duplicates, {self.stale} from stale executions{through}"
        )


def receiver_process(workdir: Path, cwd: Path, bootstrap: str, group: str) -> PodProcess:
    """Describe the example receiver's process (its log and database in ``workdir``)."""
    argv = [
        *(sys.executable, RECEIVER_SCRIPT, "--bootstrap-servers", bootstrap),
        *("--db", str(workdir / "notifications.sqlite3"), "--group", f"{group}-notifier"),
        *("--topic", READY_TOPIC),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return PodProcess("receiver", argv, env, cwd, workdir / "receiver.log")


async def tally(store: EffectStore, workdir: Path) -> Notifications:
    """Count the committed messages (the store) and what the receiver recorded (its file)."""
    committed = {entry.row.effect_id for entry in await store.outbox_entries()}
    notified, dropped = await anyio.to_thread.run_sync(_received, workdir / "notifications.sqlite3")
    return Notifications(
        committed=len(committed),
        delivered_once=len(committed & notified),
        duplicates=dropped.get("duplicate", 0),
        stale=dropped.get("stale", 0),
        got_through=len(notified - committed),
    )


def _received(db: Path) -> tuple[set[str], dict[str, int]]:
    """Return the notified effect ids and the dropped ones' count by status (none yet: empty)."""
    if not db.exists():
        return set(), {}
    with contextlib.closing(sqlite3.connect(db, timeout=5)) as conn:
        try:
            notified = {row[0] for row in conn.execute("SELECT effect_id FROM notification")}
            counts = conn.execute("SELECT status, count(*) FROM dropped GROUP BY status")
            return notified, dict(counts.fetchall())
        except sqlite3.OperationalError:  # its tables are not made yet
            return set(), {}


async def until_delivered(store_url: str, workdir: Path, *, within: float) -> Notifications:
    """Wait until every committed message was notified (or ``within`` s passed); return the tally.

    Called once every trigger completed: no more messages are committed, so
    the condition is final once it holds.
    """
    counted = Notifications()
    async with open_store(store_url) as opened:  # the pods' store, opened once
        store = effect_store(opened)
        with anyio.move_on_after(within):
            while not (counted := await tally(store, workdir)).ok:  # noqa: ASYNC110 - processes
                await anyio.sleep(0.2)
    return counted
