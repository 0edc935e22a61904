"""Test helper: leases whose Redis traffic goes through a ChaosProxy."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from leaseworker import RedisLeases
from leaseworker._lease import RELEASE
from leaseworker._lease._scripts import ACQUIRE, RENEW
from leaseworker.testing import ChaosProxy
from leaseworker_dev._services import LocalRedis


@contextlib.asynccontextmanager
async def proxied_leases(
    server: LocalRedis, namespace: str, *, command_timeout: float = 0.3
) -> AsyncIterator[tuple[ChaosProxy, RedisLeases]]:
    """Leases whose traffic to Redis goes through a ChaosProxy, its first connection open.

    The first connection and the scripts are set up before the test's first
    call, outside any ``command_timeout``: a first acquire on a loaded
    machine, in a long suite's process, could otherwise spend its budget of a
    few hundred milliseconds before its own command was sent, and fail with
    no fault on (or pass a test of a fault without its command ever sent).
    """
    async with ChaosProxy(server.port) as proxy:
        # No client-side retries: the test wants to see each fault exactly once.
        # No handshake (RESP2: no HELLO; driver_info=None: no CLIENT SETINFO):
        # a reconnect, as the best-effort release after a timed-out acquire
        # makes, sends its command at once; with a handshake on a slow link
        # the release would not be sent in time (the lease then expires).
        client = Redis(
            host="127.0.0.1",
            port=proxy.port,
            retry=Retry(NoBackoff(), 0),
            protocol=2,
            driver_info=None,
        )
        try:
            with anyio.fail_after(30):
                await client.ping()
                for source in (ACQUIRE, RENEW, RELEASE):
                    await client.script_load(source)
            yield proxy, RedisLeases(client, namespace=namespace, command_timeout=command_timeout)
        finally:
            await client.aclose()
