"""Waiting for state that lives outside the test's process (Redis keys, brokers).

In-process coordination uses events; a real server's state (a key expiring in
Redis) cannot signal us, so it is polled here, always under a deadline.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio


async def eventually(check: Callable[[], Awaitable[bool]], *, within: float = 5.0) -> None:
    """Return once ``check()`` is true; fail with TimeoutError after ``within`` seconds."""
    with anyio.fail_after(within):
        while not await check():  # noqa: ASYNC110 - external state cannot set an Event
            await anyio.sleep(0.01)
