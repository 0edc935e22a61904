"""Helpers for the process pool's tests: run a job function, wait for a marker."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from leaseworker._process import Identity, Mirror, ProcessPool, Usage
from tests.waiting import eventually

IDENTITY = Identity("report-42", "execution-1", 7)


class Call:
    """One ``pool.run`` with its mirror (once followed) and its usage reports."""

    def __init__(self) -> None:
        self.mirrors: list[Mirror] = []
        self.unfollowed = 0
        self.usages: list[Usage] = []

    def follow(self, mirror: Mirror) -> Callable[[], None]:
        """Keep ``mirror``; count the unfollow."""
        self.mirrors.append(mirror)

        def unfollow() -> None:
            self.unfollowed += 1

        return unfollow

    async def run(
        self, pool: ProcessPool, fn: Callable[..., object], *args: object, deadline: float = 10.0
    ) -> object:
        """``pool.run(fn, args)`` with a deadline ``deadline`` seconds away."""
        return await pool.run(
            fn,
            args,
            {},
            identity=IDENTITY,
            deadline=time.monotonic() + deadline,
            follow=self.follow,
            usage=self.usages.append,
        )


async def marked(path: Path, *, within: float = 10.0) -> str:
    """The text of the marker file ``path`` once the child wrote it."""
    await eventually(lambda: _exists(path), within=within)
    return _read(path)


async def _exists(path: Path) -> bool:
    return path.exists()  # noqa: ASYNC240 - a marker file on tmpfs, microseconds


def _read(path: Path) -> str:
    return path.read_text()
