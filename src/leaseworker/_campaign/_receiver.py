"""The campaign's receiver: every effects topic consumed, each effect through an inbox.

It stands for a user's downstream service. It subscribes to every topic but
the campaign's trigger and dead-letter topics (the broker creates an effects
topic on its first message: the campaign need not know the job's topics),
reads from the beginning, and records each effect in a
:class:`~leaseworker.effects.SqliteInbox` in its own database, inserting its
own effect row only when the inbox says ``new``. Every record consumed is a
:class:`~._records.Delivery`; the effect rows (``processed``) are counted
from its table, so the checker does not take the inbox's word for them.
"""

from __future__ import annotations

import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import anyio
from aiokafka import AIOKafkaConsumer  # type: ignore[import-untyped]

from .._effects import Effect, SqliteInbox
from .._kafka import KafkaSecurity
from ._records import Delivery

RECEIVER = "chaos-receiver"
"""The inbox's receiver name."""

_EFFECTS = "CREATE TABLE IF NOT EXISTS chaos_effects (effect_id TEXT NOT NULL, fence INTEGER)"


def effects_pattern(*excluded: str) -> str:
    """Match every topic but ``excluded`` and Kafka's internal ones (``__...``)."""
    names = "|".join(re.escape(name) for name in excluded)
    return rf"^(?!__|(?:{names})$).+"


class Receiver:
    """Consume the effects topics until cancelled; see the module docstring."""

    def __init__(
        self,
        bootstrap: str,
        group: str,
        excluded: list[str],
        workdir: Path,
        security: KafkaSecurity | None = None,
    ) -> None:
        self._bootstrap = bootstrap
        self._security = security or KafkaSecurity()
        self._group = group
        self._pattern = effects_pattern(*excluded)
        self._db = sqlite3.connect(workdir / "receiver.db", isolation_level=None)
        self._inbox = SqliteInbox(RECEIVER)
        self._inbox.setup(self._db)
        self._db.execute(_EFFECTS)  # no unique key: an effect processed twice shows twice
        self.deliveries: list[Delivery] = []
        self._consumer: Any = None

    async def run(self) -> None:
        """Consume and record until cancelled, riding out broker restarts."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            group_id=self._group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            metadata_max_age_ms=1000,  # find a newly created effects topic within a second
            **self._security.client_kwargs(),
        )
        consumer.subscribe(pattern=self._pattern)
        while True:
            try:
                with anyio.fail_after(30):
                    await consumer.start()
                break
            except Exception:  # the broker restarting as the campaign begins: try again
                await anyio.sleep(1.0)
        self._consumer = consumer
        try:
            while True:
                batch = await consumer.getmany(timeout_ms=200)
                for records in batch.values():
                    for record in records:
                        self._receive(record)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                await consumer.stop()
            self._db.close()

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
        """Count the receiver's effect rows per effect id."""
        rows = self._db.execute("SELECT effect_id, count(*) FROM chaos_effects GROUP BY effect_id")
        return {effect_id: int(n) for effect_id, n in rows}

    def _receive(self, record: Any) -> None:
        """Record one delivery; process the effect (an effect row) only when the inbox says new."""
        effect = Effect.from_headers(record.headers)
        status = "foreign"
        if effect is not None:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                status = self._inbox.accept(self._db, effect)
                if status == "new":
                    self._db.execute(
                        "INSERT INTO chaos_effects VALUES (?, ?)", (effect.effect_id, effect.fence)
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
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
