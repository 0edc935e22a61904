"""The campaign's receiver: the job's effects topics consumed, each effect through an inbox.

It stands for a user's downstream service. On the campaign's own broker it
subscribes to every topic but the campaign's trigger and dead-letter topics
(the broker creates an effects topic on its first message: the campaign need
not know the job's topics); on a broker given by ``--bootstrap-servers``
only to the topics of the campaign's outbox rows (``topics_of``), never the
others' topics. It reads from its committed offsets (the beginning at
first), records each effect in a :class:`~leaseworker.effects.SqliteInbox`
in its own database, inserting its own effect row only when the inbox says
``new``, and commits its offsets after each batch. The ``receiver_restart``
fault :meth:`kill` s it between processing a batch and committing it
(or within a second) and :meth:`revive` s it: a new connection, a new consumer, only the database
carried over. Every record consumed is a :class:`~._records.Delivery`; the
effect rows (``processed``) are counted from its table, so the checker does
not take the inbox's word for them. A consumer whose group coordination died
(aiokafka's own assertion when its subscription changes while it looks for a
moved coordinator, aio-libs/aiokafka#796; getmany raises it from then on) is
replaced by the next life a second later, the error kept in
``consumer_errors``.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from aiokafka import AIOKafkaConsumer  # type: ignore[import-untyped]
from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

from leaseworker.toolkit import Effect, KafkaSecurity, SqliteInbox

from ._campaign_records import Delivery

RECEIVER = "chaos-receiver"
"""The inbox's receiver name."""

_EFFECTS = "CREATE TABLE IF NOT EXISTS chaos_effects (effect_id TEXT NOT NULL, fence INTEGER)"


def effects_pattern(*excluded: str) -> str:
    """Match every topic but ``excluded`` and Kafka's internal ones (``__...``)."""
    names = "|".join(re.escape(name) for name in excluded)
    return rf"^(?!__|(?:{names})$).+"


def _exactly(topics: set[str]) -> str:
    """Match ``topics`` and nothing else (none: nothing at all)."""
    if not topics:
        return r"(?!)"
    return rf"^(?:{'|'.join(re.escape(name) for name in sorted(topics))})$"


class Receiver:
    """Consume the effects topics until cancelled; see the module docstring."""

    def __init__(
        self,
        bootstrap: str,
        group: str,
        excluded: list[str],
        workdir: Path,
        security: KafkaSecurity | None = None,
        topics_of: Callable[[], Awaitable[set[str]]] | None = None,
    ) -> None:
        self._bootstrap = bootstrap
        self._security = security or KafkaSecurity()
        self._group = group
        self._pattern = effects_pattern(*excluded)
        self._topics_of = topics_of
        self._path = workdir / "receiver.db"
        self._inbox = SqliteInbox(RECEIVER)
        with contextlib.closing(self._connect()) as db:
            self._inbox.setup(db)
            db.execute(_EFFECTS)  # no unique key: an effect processed twice shows twice
        self.deliveries: list[Delivery] = []
        self.lives = 0  # consumers started so far
        self.consumer_errors: list[str] = []  # the errors that ended a life, not a kill
        self._consumer: Any = None
        self._life = anyio.CancelScope()
        self._revived = anyio.Event()
        self._killing = False
        self._follow_at = 0.0

    async def run(self) -> None:
        """Live (consume and record) until cancelled; after a :meth:`kill`, wait to be revived.

        A life its consumer's error ended is followed by the next one a second
        later, unless a kill is under way.
        """
        while True:
            self._revived, self._killing = anyio.Event(), False
            with anyio.CancelScope() as self._life:
                try:
                    await self._live()
                except KafkaError as exc:
                    self.consumer_errors.append(f"{type(exc).__name__}: {exc}")
                    if not self._killing:
                        await anyio.sleep(1.0)
                        continue
            await self._revived.wait()

    def kill(self, within: float = 1.0) -> None:
        """End the current life once it processed a batch, before it commits its offsets.

        ``within`` seconds later at most, wherever it is (no records came).
        """
        self._killing = True
        self._life.deadline = min(self._life.deadline, anyio.current_time() + within)

    def revive(self) -> None:
        """Start the next life (after :meth:`kill`)."""
        self._revived.set()

    async def _live(self) -> None:
        """One life: a fresh connection and consumer, riding out broker restarts."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            group_id=self._group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            metadata_max_age_ms=1000,  # find a newly created effects topic within a second
            **self._security.client_kwargs(),
        )
        subscribed = None if self._topics_of is None else set[str]()
        consumer.subscribe(pattern=self._pattern if subscribed is None else _exactly(subscribed))
        db = self._connect()
        try:
            while True:
                try:
                    with anyio.fail_after(30):
                        await consumer.start()
                    break
                except Exception:  # the broker restarting as the campaign begins: try again
                    await anyio.sleep(1.0)
            self.lives += 1
            self._consumer = consumer
            while True:
                subscribed = await self._follow(consumer, subscribed)
                batch = await consumer.getmany(timeout_ms=200)
                for records in batch.values():
                    for record in records:
                        self._receive(db, record)
                if batch and self._killing:  # processed, not committed: redelivered next life
                    self._life.cancel()
                    await anyio.lowlevel.checkpoint()
                if batch:
                    with contextlib.suppress(Exception):  # the broker away: committed later
                        await consumer.commit()
        finally:
            self._consumer = None
            with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                await consumer.stop()
            db.close()

    async def _follow(self, consumer: Any, subscribed: set[str] | None) -> set[str] | None:
        """Subscribe to the topics ``topics_of`` names now, if they changed (``None``: all)."""
        now = anyio.current_time()
        if subscribed is None or self._topics_of is None or now < self._follow_at:
            return subscribed
        self._follow_at = now + 1.0  # the store asked once a second at most
        with contextlib.suppress(Exception):  # the store away: the same topics for now
            found = await self._topics_of()
            if found != subscribed:
                consumer.subscribe(pattern=_exactly(found))
                return found
        return subscribed

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self._path, isolation_level=None)

    async def behind(self) -> int | None:
        """Count the records not consumed yet on its partitions (``None``: none held, unknown)."""
        consumer = self._consumer
        if consumer is None or not consumer.assignment():
            return None
        partitions = list(consumer.assignment())
        try:
            with anyio.fail_after(10):
                ends = await consumer.end_offsets(partitions)
                left = 0
                for tp, end in ends.items():
                    left += max(0, int(end) - int(await consumer.position(tp)))
                return left
        except Exception:  # the broker away: not known now
            return None

    def topics(self) -> set[str]:
        """Return the effects topics it holds partitions of."""
        consumer = self._consumer
        return set() if consumer is None else {tp.topic for tp in consumer.assignment()}

    def processed(self) -> dict[str, int]:
        """Count the receiver's effect rows per effect id (read from its database file)."""
        with contextlib.closing(self._connect()) as db:
            rows = db.execute("SELECT effect_id, count(*) FROM chaos_effects GROUP BY effect_id")
            return {effect_id: int(n) for effect_id, n in rows}

    def _receive(self, db: sqlite3.Connection, record: Any) -> None:
        """Record one delivery; process the effect (an effect row) only when the inbox says new."""
        effect = Effect.from_headers(record.headers)
        status = "foreign"
        if effect is not None:
            db.execute("BEGIN IMMEDIATE")
            try:
                status = self._inbox.accept(db, effect)
                if status == "new":
                    db.execute(
                        "INSERT INTO chaos_effects VALUES (?, ?)", (effect.effect_id, effect.fence)
                    )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        self.deliveries.append(
            Delivery(
                effect_id=None if effect is None else effect.effect_id,
                fence=-1 if effect is None else effect.fence,
                status=status,
                topic=record.topic,
                partition=record.partition,
                offset=record.offset,
                created=record.timestamp / 1000,
                received=time.time(),
            )
        )
