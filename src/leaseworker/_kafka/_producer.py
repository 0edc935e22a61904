"""``send_trigger``: produce one trigger record, bounded in time (``leaseworker trigger``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import anyio
from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]
from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

from ._security import KafkaSecurity

__all__ = ["KafkaError", "send_trigger"]


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
    """Produce one trigger (acks=all) within ``within`` seconds; return (partition, offset)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap_servers,
        acks="all",
        request_timeout_ms=max(1, int(within * 1000)),
        client_id="leaseworker-trigger",
        **(security or KafkaSecurity()).client_kwargs(),
    )
    with anyio.fail_after(within):
        await producer.start()
        try:
            meta = await producer.send_and_wait(
                topic,
                value=json.dumps(payload).encode(),
                key=None if key is None else key.encode(),
                headers=list(headers) or None,
            )
        finally:
            await producer.stop()
    return int(meta.partition), int(meta.offset)
