"""``KafkaSender``: the outbox relay's idempotent producer (``acks=all``).

The relay (``leaseworker._effects``) hands it a wave of outbox rows (of
distinct job keys) and waits for the broker's acknowledgements before
marking them sent. The rows go in as whole record batches, one or more per
partition, built here (``_record_batches``): the records and partitions
``producer.send`` would make, at a third of its cost per row. The
producer is started on first use and kept, reconnecting by itself while a
broker restarts. Every send is bounded by ``timeout``. After a running
client's SASL login was refused (``_logins``) and the password file holds a
new password, the producer is stopped and built again with it; with the same
password it is kept (the pod's source decides on exit 2).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, final

import anyio
from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]
from aiokafka.partitioner import DefaultPartitioner  # type: ignore[import-untyped]
from murmurhash2 import murmurhash2

from .._store import OutboxRow
from ._logins import Login
from ._quiet import quiet
from ._security import KafkaSecurity

BATCH_BYTES = 65_536
"""Bytes per record batch (aiokafka's default is 16 KiB): fewer, fuller produce requests.

A 1,000-row wave over four partitions is about 32 KiB a partition (130 bytes
a row): one batch each, not two or three, the later ones each waiting for a
produce round trip of their own (bench/README.md, relay).
"""

SEND_TIMEOUT = 10.0
"""Seconds the sender may take to start its producer, and again for one wave of sends."""


@final
class KafkaSender:
    """Send outbox rows with the idempotent producer; see the module docstring."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        security: KafkaSecurity | None = None,
        client_id: str = "leaseworker-relay",
        timeout: float = SEND_TIMEOUT,
    ) -> None:
        self._bootstrap = bootstrap_servers
        self._security = security or KafkaSecurity()
        self._client_id = client_id
        self._timeout = timeout
        self._producer: Any = None
        self._starting = anyio.Lock()
        self._start_failed: tuple[float, BaseException] | None = None  # (when, why)
        self._login = Login(self._security)

    async def send(self, row: OutboxRow) -> tuple[int, int]:
        """Send ``row`` and return (partition, offset) once every in-sync replica has it."""
        (outcome,) = await self.send_batch([row])
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def send_batch(self, rows: Sequence[OutboxRow]) -> list[tuple[int, int] | Exception]:
        """Send ``rows`` together; wait for every answer (see :func:`_record_batches`).

        Each answer is (partition, offset) once every in-sync replica has the
        row, or why not; the whole wave is bounded by ``timeout``.
        """
        try:
            producer = await self._started()
        except Exception as exc:  # the brokers are down: every row fails alike
            return [exc] * len(rows)
        outcomes: list[tuple[int, int] | Exception | None] = [None] * len(rows)
        with anyio.move_on_after(self._timeout):
            for delivery, members in await _record_batches(producer, rows):
                try:
                    meta = await delivery
                except Exception as exc:  # the batch's every row failed alike
                    for index, _ in members:
                        outcomes[index] = exc
                else:
                    partition, base = int(meta.partition), int(meta.offset)
                    for index, relative in members:
                        outcomes[index] = (partition, base + relative)
        timeout = TimeoutError(f"no acknowledgement within {self._timeout}s")
        answers = [timeout if outcome is None else outcome for outcome in outcomes]
        if any(isinstance(answer, Exception) for answer in answers):
            await self._discard(producer)
        return answers

    async def _discard(self, producer: Any) -> None:
        """Drop ``producer`` after a failed send: the next send starts a new one.

        An idempotent producer whose batch failed (a record the broker refused,
        a send that timed out) has spent that sequence number: aiokafka answers
        every later send OutOfOrderSequenceNumber, so the relay would never
        deliver again. A new producer gets a new producer id.
        """
        async with self._starting:
            if self._producer is not producer:
                return  # another wave's failure dropped it already
            self._producer = None
        with anyio.CancelScope(shield=True), anyio.move_on_after(self._timeout):
            await producer.stop()

    async def aclose(self) -> None:
        """Stop the producer (flushing what it holds, within ``timeout``)."""
        producer, self._producer = self._producer, None
        if producer is not None:
            with anyio.CancelScope(shield=True), anyio.move_on_after(self._timeout):
                await producer.stop()

    async def _started(self) -> Any:
        """Return the started producer; start it first (a start that just failed is not retried).

        Once started, no lock is taken: acquiring one yields to the event
        loop, and the producer would then send a wave in many small requests.

        The relay's chains all wait here while the brokers are down: the first
        one's failure answers the others at once, for ``timeout`` seconds, so a
        round of many keys fails in one ``timeout``, not one per key.
        """
        if self._producer is not None and not self._login.refused():  # one comparison, no yield
            return self._producer
        async with self._starting:
            failed = self._start_failed
            if failed is not None and anyio.current_time() - failed[0] < self._timeout:
                raise failed[1]
            if self._producer is not None and self._login.refused():
                if self._login.rotated():
                    await self.aclose()  # built again below, with the new password
                self._login.seen()
            if self._producer is None:
                self._login.built()
                producer = AIOKafkaProducer(
                    bootstrap_servers=self._bootstrap,
                    acks="all",
                    enable_idempotence=True,
                    request_timeout_ms=max(1, int(self._timeout * 1000)),
                    client_id=self._client_id,
                    max_batch_size=BATCH_BYTES,
                    **self._security.client_kwargs(),
                )
                quiet(producer.client)
                try:
                    with anyio.fail_after(self._timeout):
                        await producer.start()
                except BaseException as exc:
                    self._start_failed = (anyio.current_time(), exc)
                    with anyio.CancelScope(shield=True), anyio.move_on_after(self._timeout):
                        await producer.stop()
                    raise
                self._producer, self._start_failed = producer, None
            return self._producer


_Members = list[tuple[int, int]]
"""A record batch's rows: (index in the wave, offset within the batch)."""


async def _record_batches(
    producer: Any, rows: Sequence[OutboxRow]
) -> list[tuple[asyncio.Future[Any], _Members]]:
    """Queue ``rows`` as whole record batches, one or more per partition; return their deliveries.

    The partition is the one ``producer.send`` would pick (the producer's
    default partitioner, keyed by the message key), and the records are those
    it would write, in the same order; but each batch is built here and queued
    with ``producer.send_batch``: no future, partition look-up or size
    estimate per row, and one answer per batch (a failed batch fails its
    rows alike, as the broker does). The batches of a partition after its
    first wait for the one before to be taken by the sender.
    """
    groups, deliveries = await _by_partition(producer, rows)
    queue = [
        (nth, topic, partition, batch, members)
        for (topic, partition), indexes in groups.items()
        for nth, (batch, members) in enumerate(_built(producer, rows, indexes))
    ]
    queue.sort(key=lambda queued: queued[0])  # every partition's first batch, then the seconds
    for _, topic, partition, batch, members in queue:
        try:
            delivery = await producer.send_batch(batch, topic, partition=partition)
        except Exception as exc:  # the producer is closed or failed
            delivery = _failed(exc)
        deliveries.append((delivery, members))
    return deliveries


async def _by_partition(
    producer: Any, rows: Sequence[OutboxRow]
) -> tuple[dict[tuple[str, int], list[int]], list[tuple[asyncio.Future[Any], _Members]]]:
    """Return the rows' indexes by (topic, partition), and the rows whose topic failed."""
    groups: dict[tuple[str, int], list[int]] = {}
    failed: list[tuple[asyncio.Future[Any], _Members]] = []
    partitions: dict[str, tuple[list[int], list[int]] | Exception] = {}
    for index, row in enumerate(rows):
        topic = row.message.topic
        known = partitions.get(topic)
        if known is None:
            try:  # no yield once the producer has the topic's metadata
                every = list(await producer.partitions_for(topic))
            except Exception as exc:  # e.g. no such topic: its rows fail
                known = partitions[topic] = exc
            else:
                up = producer.client.cluster.available_partitions_for_topic(topic)
                known = partitions[topic] = (every, list(up or ()))
        if isinstance(known, Exception):
            failed.append((_failed(known), [(index, 0)]))
        else:
            partition = _partition(row.message.key, *known)
            groups.setdefault((topic, partition), []).append(index)
    return groups, failed


def _built(
    producer: Any, rows: Sequence[OutboxRow], indexes: list[int]
) -> list[tuple[Any, _Members]]:
    """Return the closed record batches holding ``rows[indexes]`` in order (a new one when full)."""
    built: list[tuple[Any, _Members]] = []
    batch, members = producer.create_batch(), _Members()
    for index in indexes:
        message = rows[index].message
        headers = rows[index].kafka_headers()
        record = batch.append(timestamp=None, key=message.key, value=message.value, headers=headers)
        if record is None:  # full: this row starts the next batch (a first row always fits)
            batch.close()
            built.append((batch, members))
            batch, members = producer.create_batch(), _Members()
            record = batch.append(
                timestamp=None, key=message.key, value=message.value, headers=headers
            )
        members.append((index, int(record.offset)))
    batch.close()
    built.append((batch, members))
    return built


_PARTITIONER = DefaultPartitioner()
"""The producer's default partitioner (``KafkaSender`` sets no other)."""

_MURMUR2_SEED = 0x9747B28C
"""The seed of Kafka's murmur2 (``Utils.murmur2``): every client's default partitioner's hash."""


def _partition(key: bytes | None, every: list[int], up: list[int]) -> int:
    """Return the partition ``_PARTITIONER`` picks for ``key``; for a key at an eighth of the cost.

    aiokafka's murmur2 is pure Python (2.4 µs for a 10-byte key, the relay's
    largest cost per row after decoding it); the ``murmurhash2`` package's
    compiled one gives the same hash in 0.3 µs (tests/effects/test_sender.py
    compares them). A message without a key goes where aiokafka sends it: a
    random partition, one that is up if any is.
    """
    if key is None:
        return int(_PARTITIONER(None, every, up))
    return every[(murmurhash2(key, _MURMUR2_SEED) & 0x7FFFFFFF) % len(every)]


def _failed(exc: Exception) -> asyncio.Future[Any]:
    """Return a future holding ``exc``: rows the producer refused before sending."""
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_exception(exc)
    return future
