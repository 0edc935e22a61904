"""A receiver of ``reports.ready``: one notification per report, whatever the relay redelivers.

Run it (from this directory, next to the pods)::

    python ready_receiver.py --bootstrap-servers 127.0.0.1:9092 --db notifications.sqlite3

The relay delivers each committed message at least once. The receiver
records every effect in its own transaction (``SqliteInbox``) together with
the notification the effect causes, so a redelivered message is a
``duplicate`` and one whose fence is below the highest seen for its report
is ``stale``: both are dropped (and noted in ``dropped``, for the demo's
summary). Sending an e-mail instead of writing a row? Give the mail service
``effect.effect_id`` as its idempotency key (docs/effects.md). SIGTERM or
Ctrl-C stops it after the record in hand.
"""

from __future__ import annotations

import argparse
import json
import signal
import sqlite3
from collections.abc import Iterable, Sequence

import anyio
from aiokafka import AIOKafkaConsumer  # type: ignore[import-untyped]

from leaseworker import Hook
from leaseworker.effects import Effect, EffectStatus, SqliteInbox

RECEIVER = "report-notifier"
"""The inbox's name: receivers sharing one database keep apart by it."""

TABLES = (
    """
    CREATE TABLE IF NOT EXISTS notification (
        effect_id TEXT PRIMARY KEY,
        job_key   TEXT NOT NULL,
        fence     INTEGER NOT NULL,
        tenant    TEXT NOT NULL,
        period    TEXT NOT NULL
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS dropped (
        effect_id TEXT NOT NULL,
        status    TEXT NOT NULL,
        fence     INTEGER NOT NULL
    )
    """,
)


class Notifier:
    """Turns each ``reports.ready`` message into one notification row, in one transaction."""

    def __init__(self, conn: sqlite3.Connection, *, hooks: Iterable[Hook] = ()) -> None:
        self.conn = conn  # autocommit mode: each message's transaction is explicit
        self.inbox = SqliteInbox(RECEIVER, hooks=hooks)  # hooks: e.g. a pod's telemetry
        self.inbox.setup(conn)
        for table in TABLES:
            conn.execute(table)

    def handle(self, headers: Sequence[tuple[str, bytes]] | None, value: bytes) -> EffectStatus:
        """Process one message: a ``new`` effect notifies, a duplicate or stale one is dropped."""
        effect = Effect.from_headers(headers)
        if effect is None:
            raise ValueError("not a leaseworker effect: no leaseworker-* headers")
        report = json.loads(value)
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            status = self.inbox.accept(self.conn, effect)
            if status == "new":
                self.conn.execute(
                    "INSERT INTO notification VALUES (?, ?, ?, ?, ?)",
                    (
                        effect.effect_id,
                        effect.job_key,
                        effect.fence,
                        report["tenant"],
                        report["period"],
                    ),
                )
            else:
                self.conn.execute(
                    "INSERT INTO dropped VALUES (?, ?, ?)", (effect.effect_id, status, effect.fence)
                )
            self.conn.execute("COMMIT")
        except BaseException:
            self.conn.execute("ROLLBACK")  # the inbox's record goes too: a redelivery is new again
            raise
        return status


async def receive(bootstrap: str, db: str, *, topic: str, group: str, stop: anyio.Event) -> None:
    """Consume ``topic`` until ``stop`` is set, committing each batch after its transactions."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")  # the demo reads it while the receiver writes
    notifier = Notifier(conn)
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                for record in records:
                    status = notifier.handle(record.headers, record.value)
                    print(f"offset {record.offset}: {status}", flush=True)  # no payload
            if batch:
                await consumer.commit()
    finally:
        with anyio.CancelScope(shield=True):
            await consumer.stop()
        conn.close()


async def _until_signal(bootstrap: str, db: str, topic: str, group: str) -> None:
    """Receive until SIGTERM or SIGINT (the batch in hand is finished and committed)."""
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:

            async def wait_for_signal() -> None:
                async for _ in signals:
                    stop.set()
                    return

            tg.start_soon(wait_for_signal)
            await receive(bootstrap, db, topic=topic, group=group, stop=stop)
            tg.cancel_scope.cancel()


def main() -> None:
    """Parse the flags and receive until stopped."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    parser.add_argument("--db", default="notifications.sqlite3", help="the receiver's database")
    parser.add_argument("--topic", default="reports.ready")
    parser.add_argument("--group", default=RECEIVER, help="the receiver's consumer group")
    args = parser.parse_args()
    anyio.run(_until_signal, args.bootstrap_servers, args.db, args.topic, args.group)


if __name__ == "__main__":
    main()
