"""A pod in a process of its own: ``python -m tests.process.pod_script MARKER DEADLINE``.

Starts a one-worker pool, prints the call's deadline (``time.monotonic()``, a clock
Linux shares between processes), then runs
``jobs.spin_with_grandchild`` with a deadline DEADLINE seconds away (the test kills or
stops this process while the child computes and its grandchild sleeps).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import anyio

from leaseworker._process import Identity, Mirror, ProcessPool
from tests.process import jobs


def _follow(mirror: Mirror) -> Callable[[], None]:
    return _unfollow


def _unfollow() -> None:
    return None


async def main(marker: str, deadline: float) -> None:
    """Run the spinning job until killed."""
    async with ProcessPool(1) as pool:
        until = time.monotonic() + deadline
        print(until, flush=True)
        await pool.run(
            jobs.spin_with_grandchild,
            (marker,),
            {},
            identity=Identity("report-42", "execution-1", 1),
            deadline=until,
            follow=_follow,
        )


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], float(sys.argv[2]))
