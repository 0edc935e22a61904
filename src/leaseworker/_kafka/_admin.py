"""``started_admin``: the one way the Kafka layer opens an aiokafka admin client.

Creating topics (``create_topics``) and checking them at start
(``require_topics``) both need a client that starts, does one short job and
closes on every path, a cancelled caller included; this keeps that in one
place, with the pod's SASL/TLS settings, a quiet outage (``_quiet``) and
refusals told apart from outages (``_refusals``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
from aiokafka.admin import AIOKafkaAdminClient  # type: ignore[import-untyped]
from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

from ._quiet import quiet
from ._refusals import check_refused
from ._security import KafkaSecurity


@contextlib.asynccontextmanager
async def started_admin(
    bootstrap_servers: str, *, security: KafkaSecurity, within: float, client_id: str
) -> AsyncIterator[Any]:
    """Yield a started admin client whose requests time out after ``within`` seconds.

    The caller bounds the whole job (``anyio.fail_after``); the close is
    shielded from that and bounded by ``within`` on its own, so an expired or
    cancelled job still closes the client's connections. A start that fails
    because the brokers refuse these credentials or certificates raises
    :class:`~leaseworker.ConfigError` (``_refusals``); other failures propagate.
    """
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap_servers,
        client_id=client_id,
        request_timeout_ms=max(1, round(within * 1000)),
        **security.client_kwargs(),
    )
    quiet(admin._client)
    try:
        try:
            await admin.start()
        except (KafkaError, OSError) as exc:
            await check_refused(bootstrap_servers, exc, security=security, within=within)
            raise
        yield admin
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(within):
            await admin.close()
