"""``KafkaSender.send_batch`` on a real broker: each row where ``producer.send`` would put it.

The sender builds the record batches itself (several per partition when a
wave outgrows one); the offsets it answers must be the rows' own, and each
row's partition the one the producer's default partitioner picks for its key.
"""

from __future__ import annotations

import anyio
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition  # type: ignore[import-untyped]
from aiokafka.partitioner import DefaultPartitioner, murmur2  # type: ignore[import-untyped]
from hypothesis import given
from hypothesis import strategies as st

from leaseworker._kafka import KafkaSender
from leaseworker._kafka._outbox_sender import _partition
from leaseworker._store import Message, OutboxRow
from leaseworker_dev._services import LocalKafka

from ..kafka_util import KafkaNames

PARTITIONS = 3


async def read_all(bootstrap: str, topic: str, count: int) -> dict[tuple[int, int], bytes]:
    """Return the effect id header of every record of ``topic`` by (partition, offset)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    found: dict[tuple[int, int], bytes] = {}
    with anyio.fail_after(30):
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
            while len(found) < count:
                for part in (await consumer.getmany(timeout_ms=200)).values():
                    for record in part:
                        headers = dict(record.headers)
                        found[record.partition, record.offset] = headers["leaseworker-effect-id"]
        finally:
            await consumer.stop()
    return found


async def test_a_wave_of_many_batches_answers_each_rows_partition_and_offset(
    kafka_server: LocalKafka, kafka_names: KafkaNames
) -> None:
    """300 rows of 1 KB (15 to a 16 KiB batch), sent twice: each answer is the row's place."""
    topic = f"{kafka_names.topic}-sender"
    kafka_server.create_topics([topic], partitions=PARTITIONS)
    rows = [
        OutboxRow(
            id=n,
            job_key=f"key-{n}",
            input_version="v1",
            seq=0,
            fence=1,
            message=Message.build(topic, b"x" * 1000, key=f"key-{n}"),
        )
        for n in range(300)
    ]
    sender = KafkaSender(kafka_server.bootstrap_servers)
    try:
        answers = [*await sender.send_batch(rows), *await sender.send_batch(rows)]
    finally:
        await sender.aclose()
    assert not [answer for answer in answers if isinstance(answer, Exception)]
    found = await read_all(kafka_server.bootstrap_servers, topic, 600)
    assert len(set(answers)) == 600
    for row, answer in zip([*rows, *rows], answers, strict=True):
        assert not isinstance(answer, Exception)
        assert found[answer] == row.effect_id.encode()
        assert row.message.key is not None
        assert answer[0] == (murmur2(row.message.key) & 0x7FFFFFFF) % PARTITIONS


# Kafka's own murmur2 results (its UtilsTest), as the signed ints Java returns.
KAFKA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize("key", list(KAFKA_MURMUR2))
def test_a_keyed_row_goes_where_the_java_client_puts_it(key: bytes) -> None:
    """Java's partition for a key: its murmur2, made positive, modulo the partition count."""
    every = list(range(7))
    assert _partition(key, every, every) == (KAFKA_MURMUR2[key] & 0x7FFFFFFF) % 7


@given(
    key=st.binary(max_size=80),
    count=st.integers(min_value=1, max_value=64),
    up=st.integers(min_value=0, max_value=64),
)
def test_a_keyed_row_goes_where_aiokafka_puts_it(key: bytes, count: int, up: int) -> None:
    """The compiled murmur2 picks the partition aiokafka's pure-Python one picks, for any key."""
    every = list(range(count))
    available = every[: min(up, count)]
    assert _partition(key, every, available) == DefaultPartitioner()(key, every, available)
