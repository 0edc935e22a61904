"""Worker A of the CPU-bound incident: a process of its own that holds the lease and computes.

``python -m leaseworker_dev._demos._cpu_holder PORT NAMESPACE KEY LEASE WHERE MARKS``
enters ``hold()`` on the Redis at ``PORT`` (the demo's fault proxy) and runs
:func:`~leaseworker_dev._services.crunch` for three lease durations, never
awaiting: in its event loop (``WHERE`` = ``loop``, as the incident's job did)
or through ``held.run_in_process`` (``process``). It prints one JSON line per
event (``at`` on the monotonic clock, which the demo's process shares) and
exits 0 once the hold ended, however it ended.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Literal

import anyio
from redis.asyncio import Redis

from leaseworker.toolkit import LeaseLost, ProcessPool, RedisLeases, hold

from .._services import crunch

Where = Literal["loop", "process"]
WORK = 3.0
"""The CPU loop's length, in lease durations."""


def say(event: str, text: str, at: float | None = None) -> None:
    """Print one event line for the demo (``at`` defaults to now)."""
    at = time.monotonic() if at is None else at
    print(json.dumps({"event": event, "at": at, "text": text}), flush=True)


async def hold_and_crunch(
    port: int, namespace: str, key: str, lease: float, where: Where, marks: str
) -> None:
    """Acquire ``key``, compute for ``WORK`` leases in ``where``, report how it ended."""
    client = Redis(host="127.0.0.1", port=port)
    leases = RedisLeases(client, namespace=namespace, command_timeout=lease / 5)
    pool = ProcessPool(1, preload=(crunch.__module__,)) if where == "process" else None
    try:
        if pool is not None:
            await pool.start()  # warm before the lease: the demo times the lease, not a start-up
        seconds = WORK * lease
        try:
            async with hold(
                leases, key, lease_duration=lease, renewal_interval=lease / 4, processes=pool
            ) as held:
                say("acquired", f"acquired the lease (fence {held.fence}), CPU loop starts")
                if where == "loop":
                    crunch(None, seconds, marks)  # never awaits: the event loop is stuck here
                    say("computed", f"CPU loop finished after {seconds:.1f}s")
                else:
                    await held.run_in_process(crunch, seconds, marks)
                    say("computed", f"child finished its {seconds:.1f}s CPU loop")
        except LeaseLost as lost:
            say(
                "lost",
                f"LeaseLost: reason={lost.reason}, stopped "
                f"{(lost.stop_latency or 0) * 1000:.1f} ms after the loss",
            )
    finally:
        if pool is not None:
            await pool.aclose()
        await client.aclose()


def main(argv: list[str]) -> None:
    """Run worker A from its command line."""
    port, namespace, key, lease, said, marks = argv
    where: Where = "process" if said == "process" else "loop"
    anyio.run(hold_and_crunch, int(port), namespace, key, float(lease), where, marks)


if __name__ == "__main__":
    main(sys.argv[1:])
