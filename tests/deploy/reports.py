"""Helpers (no tests): the example job's trigger topic, which compose and kube tests share."""

from __future__ import annotations

import anyio
from aiokafka import AIOKafkaConsumer, TopicPartition  # type: ignore[import-untyped]

from ..kafka_util import committed

TOPIC = "reports.requested"
"""The topic examples.report_job.monthly_report:MonthlyReport reads (fixed in the job)."""

PARTITIONS = 6
"""As compose.yaml's topic creator makes it."""


async def topic_size(bootstrap: str) -> int:
    """How many records the topic holds (the sum of its partitions' end offsets)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    with anyio.fail_after(30):
        await consumer.start()
        try:
            partitions = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
            consumer.assign(partitions)
            ends = await consumer.end_offsets(partitions)
        finally:
            await consumer.stop()
    return int(sum(ends.values()))


async def all_committed(bootstrap: str, group: str) -> bool:
    """Whether ``group`` committed every record of the topic (it reads from the earliest)."""
    found = await committed(bootstrap, group, TOPIC)
    return sum(found.values()) == await topic_size(bootstrap)
