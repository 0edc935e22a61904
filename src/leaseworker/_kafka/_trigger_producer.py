"""``send_trigger``: produce one trigger record, bounded in time (``leaseworker trigger``).

The topic is checked first (a missing one is :class:`~leaseworker.ConfigError`,
unless the brokers create topics), and the producer is stopped on every path,
so a broker that never answers leaves no unclosed client behind.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import anyio
from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]

from ._quiet import quiet
from ._security import KafkaSecurity
from ._topics import require_topics

__all__ = ["send_trigger"]


async def send_trigger(
    bootstrap_servers: str,
    topic: str,
    *,
    key: str | None,
    payload: dict[str, Any],
    within: float = 30.0,
    headers: Sequence[tuple[str, bytes]] = (),
    security: KafkaSecurity | None = None,
) -> tuple[int, int]:
    """Produce one trigger (acks=all) within ``within`` seconds; return (partition, offset).

    Raises ConfigError for a missing topic; KafkaError, OSError or
    TimeoutError when the brokers cannot be reached in time.
    """
    security = security or KafkaSecurity()
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap_servers,
        acks="all",
        request_timeout_ms=max(1, int(within * 1000)),
        client_id="leaseworker-trigger",
        **security.client_kwargs(),
    )
    quiet(producer.client)
    try:
        with anyio.fail_after(within):
            await require_topics(
                [topic],
                bootstrap_servers=bootstrap_servers,
                security=security,
                within=within,
                client_id="leaseworker-trigger",
            )
            await producer.start()
            meta = await producer.send_and_wait(
                topic,
                value=json.dumps(payload).encode(),
                key=None if key is None else key.encode(),
                headers=list(headers) or None,
            )
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(within):
            await producer.stop()
    return int(meta.partition), int(meta.offset)
