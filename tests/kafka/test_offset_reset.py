"""``--auto-offset-reset``: where a consumer group with no committed offset starts reading."""

from __future__ import annotations

import anyio
import pytest
from aiokafka import TopicPartition  # type: ignore[import-untyped]

from leaseworker._kafka import new_consumer
from leaseworker_dev._services import LocalKafka, LocalRedis

from ..kafka_util import KafkaNames, payload, produce
from ..worker_util import pod_config


@pytest.mark.parametrize(("reset", "position"), [("earliest", 0), ("latest", 2)])
async def test_a_new_group_starts_at_the_first_or_the_next_trigger(
    reset: str,
    position: int,
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
) -> None:
    """``earliest`` (the default) replays the topic; ``latest`` skips what was sent before."""
    kafka_server.create_topics([kafka_names.topic])
    await produce(kafka_server.bootstrap_servers, kafka_names.topic, [(b"a", payload())] * 2)
    config = pod_config(kafka_server, redis_server, kafka_names, namespace, auto_offset_reset=reset)
    consumer = new_consumer(config, kafka_names.topic)
    with anyio.fail_after(40):
        await consumer.start()
        try:
            tp = TopicPartition(kafka_names.topic, 0)
            assert await consumer.position(tp) == position
        finally:
            await consumer.stop()
