"""Helpers for tests on the replicated local topologies (Sentinel group, cluster).

The topologies themselves live in ``leaseworker_dev._services``; these are the
test's side: a direct client to one node (the test's view of what that node
holds, bypassing any routing), Sentinel's events and a promotion it cannot
complete, and the check that a stopped topology left nothing behind.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from leaseworker_dev._services import RedisNode


@contextlib.asynccontextmanager
async def direct(node: RedisNode, *, single_connection: bool = False) -> AsyncIterator[Redis]:
    """A plain client to ``node`` alone: no Sentinel lookup, no cluster redirection.

    ``single_connection`` keeps every command on one connection, which
    ``ASKING`` (valid for the next command on the same connection) needs.
    """
    client = Redis(
        host=node.address[0],
        port=node.port,
        socket_timeout=5,
        single_connection_client=single_connection,
    )
    try:
        yield client
    finally:
        await client.aclose()


async def command(client: Redis, *args: str | int) -> Any:
    """Send one raw command (``WAIT``, ``ROLE``, ``ASKING``) and return its reply."""
    return await client.execute_command(*args)  # type: ignore[no-untyped-call]


async def replicas_acknowledging(client: Redis, count: int, timeout_ms: int) -> int:
    """Return ``WAIT count timeout_ms``: how many replicas have every earlier write."""
    return int(await command(client, "WAIT", count, timeout_ms))


async def role(client: Redis) -> tuple[bytes, int | None]:
    """Return the node's ``ROLE`` and, for a replica, its master's port."""
    reply = await command(client, "ROLE")
    return (reply[0], reply[2] if reply[0] == b"slave" else None)


PROMOTION = ("slaveof", "replicaof")
"""The commands Sentinel promotes (``NO ONE``) and reconfigures replicas with."""


async def allow_promotion(nodes: Iterable[RedisNode], *, allowed: bool) -> None:
    """Let the default user, the one the sentinels connect as, run :data:`PROMOTION` on ``nodes``.

    Refused, Sentinel's ``SLAVEOF NO ONE`` fails inside its ``MULTI``, the
    replica stays one, and every failover Sentinel tries onto it aborts
    (``-failover-abort-slave-timeout``) once ``failover-timeout`` is over.
    """
    rules = [("+" if allowed else "-") + name for name in PROMOTION]
    for node in nodes:
        async with direct(node) as client:
            await command(client, "ACL", "SETUSER", "default", *rules)


@contextlib.asynccontextmanager
async def promotion_refused(nodes: list[RedisNode]) -> AsyncIterator[None]:
    """Refuse :data:`PROMOTION` on ``nodes`` inside the block (see :func:`allow_promotion`)."""
    await allow_promotion(nodes, allowed=False)
    try:
        yield
    finally:
        await allow_promotion(nodes, allowed=True)


@contextlib.asynccontextmanager
async def sentinel_events(sentinel: RedisNode, *events: str) -> AsyncIterator[PubSub]:
    """Subscribe to ``events`` on ``sentinel``: it publishes each event on a channel of its name.

    Returns once every subscription is confirmed, so no event after it is missed.
    """
    async with direct(sentinel) as client:
        pubsub = client.pubsub()
        await pubsub.subscribe(*events)
        for _ in events:
            confirmation = await next_message(pubsub, within=5)
            assert confirmation["type"] == "subscribe"
        try:
            yield pubsub
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call]


async def next_event(pubsub: PubSub, *, within: float = 30) -> str:
    """Return the channel (the event's name) of the next event on ``pubsub``."""
    message = await next_message(pubsub, within=within)
    assert message["type"] == "message"
    return bytes(message["channel"]).decode()


async def next_message(pubsub: PubSub, *, within: float) -> dict[str, Any]:
    """Return the next message of any type; fail with TimeoutError after ``within`` seconds."""
    with anyio.fail_after(within):
        while True:
            message = await pubsub.get_message(timeout=within)  # blocks on the socket
            if message is not None:
                return dict(message)


def assert_gone(pids: Iterable[int], workdir: Path) -> None:
    """No process of ``pids`` exists any more, and ``workdir`` was removed."""
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not workdir.exists()
