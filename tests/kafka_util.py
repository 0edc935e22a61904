"""Test helpers around a real Kafka broker: names, producing, reading commits and topics.

The broker's state (committed offsets, records on a topic) cannot signal the
test, so it is read under a deadline (see ``waiting.eventually``).
"""

from __future__ import annotations

import collections
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # type: ignore[import-untyped]
from aiokafka.admin import AIOKafkaAdminClient  # type: ignore[import-untyped]

from leaseworker import Event, ExecutionEvent


@dataclass(frozen=True)
class KafkaNames:
    """A test's own topic, dead-letter topic and consumer group."""

    suffix: str

    @property
    def topic(self) -> str:
        """The trigger topic."""
        return f"triggers-{self.suffix}"

    @property
    def dead_letters(self) -> str:
        """The dead-letter topic."""
        return f"dead-{self.suffix}"

    @property
    def group(self) -> str:
        """The consumer group of the test's worker pods."""
        return f"group-{self.suffix}"


def payload(job_id: str | None = None, **fields: Any) -> bytes:
    """Encode a trigger payload."""
    body = dict(fields)
    if job_id is not None:
        body["jobId"] = job_id
    return json.dumps(body).encode()


async def produce(
    bootstrap: str,
    topic: str,
    records: Sequence[tuple[bytes | None, bytes]],
    *,
    partition: int | None = None,
    headers: Sequence[tuple[str, bytes | None]] = (),
) -> list[int]:
    """Send ``(key, value)`` records in order (acks=all), each with ``headers``; return offsets."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    offsets = []
    with anyio.fail_after(30):
        await producer.start()
        try:
            for key, value in records:
                meta = await producer.send_and_wait(
                    topic, value=value, key=key, partition=partition, headers=list(headers)
                )
                offsets.append(meta.offset)
        finally:
            await producer.stop()
    return offsets


async def committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """Return the group's committed position per partition of ``topic`` (absent: none)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    with anyio.fail_after(15):
        try:  # a start that fails (a broker restarting) closes what it opened too
            await admin.start()
            offsets = await admin.list_consumer_group_offsets(group)
        finally:
            await admin.close()
    return {
        tp.partition: meta.offset
        for tp, meta in offsets.items()
        if tp.topic == topic and meta.offset >= 0
    }


async def end_offset(bootstrap: str, topic: str, partition: int = 0) -> int:
    """Return the log end of ``topic``'s ``partition``: the offset its next record gets."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    with anyio.fail_after(15):
        try:
            await consumer.start()
            part = TopicPartition(topic, partition)
            return int((await consumer.end_offsets([part]))[part])
        finally:
            await consumer.stop()


async def read_topic(bootstrap: str, topic: str, count: int, *, within: float = 20) -> list[Any]:
    """Read the first ``count`` records of partition 0 of ``topic`` (no group)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    records: list[Any] = []
    with anyio.fail_after(within):
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, 0)])
            while len(records) < count:
                batch = await consumer.getmany(timeout_ms=200)
                for part in batch.values():
                    records.extend(part)
        finally:
            await consumer.stop()
    return records[:count]


class StoreAnswers:
    """A hook: the store's answers to completions, and the executions' outcomes, per job key."""

    def __init__(self) -> None:
        self.answers: dict[str, list[str]] = collections.defaultdict(list)
        self.outcomes: dict[str, list[str]] = collections.defaultdict(list)

    def __call__(self, event: Event) -> None:
        """Record a ``completion``'s status or a ``finished`` execution's outcome."""
        if not isinstance(event, ExecutionEvent):
            return
        if event.event == "completion" and event.reason is not None:
            self.answers[event.attempt.job_key].append(event.reason)
        elif event.event == "finished" and event.outcome is not None:
            self.outcomes[event.attempt.job_key].append(event.outcome)
