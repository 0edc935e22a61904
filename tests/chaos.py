"""Test helper: leases whose Redis traffic goes through a ChaosProxy."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from leaseworker import RedisLeases
from leaseworker._dev._services import LocalRedis
from leaseworker.testing import ChaosProxy


@contextlib.asynccontextmanager
async def proxied_leases(
    server: LocalRedis, namespace: str, *, command_timeout: float = 0.3
) -> AsyncIterator[tuple[ChaosProxy, RedisLeases]]:
    """Leases whose traffic to Redis goes through a ChaosProxy."""
    async with ChaosProxy(server.port) as proxy:
        # No client-side retries: the test wants to see each fault exactly once.
        client = Redis(host="127.0.0.1", port=proxy.port, retry=Retry(NoBackoff(), 0))
        try:
            yield proxy, RedisLeases(client, namespace=namespace, command_timeout=command_timeout)
        finally:
            await client.aclose()
