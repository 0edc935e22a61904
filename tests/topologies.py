"""Helpers for tests on the replicated local topologies (Sentinel group, cluster).

The topologies themselves live in ``leaseworker._dev._services``; these are the
test's side: a direct client to one node (the test's view of what that node
holds, bypassing any routing) and the check that a stopped topology left
nothing behind.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from leaseworker._dev._services._nodes import RedisNode


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


def assert_gone(pids: Iterable[int], workdir: Path) -> None:
    """No process of ``pids`` exists any more, and ``workdir`` was removed."""
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not workdir.exists()
