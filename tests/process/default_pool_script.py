"""A process that uses ``ProcessPool.default()`` and exits without closing it.

``python -m tests.process.default_pool_script``: prints the worker's pid, then ends
normally; the pool's exit hook must leave no process behind.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio

from leaseworker import ProcessPool
from leaseworker._process import Identity, Mirror
from tests.process import jobs


def _follow(mirror: Mirror) -> Callable[[], None]:
    return _unfollow


def _unfollow() -> None:
    return None


async def main() -> None:
    """Run one call on the shared pool (started on first use) and print its child's pid."""
    assert ProcessPool.default() is ProcessPool.default()
    pid = await ProcessPool.default().run(
        jobs.pid,
        (),
        {},
        identity=Identity("report-42", "execution-1", 1),
        deadline=time.monotonic() + 30,
        follow=_follow,
    )
    print(pid, flush=True)


if __name__ == "__main__":
    anyio.run(main)
