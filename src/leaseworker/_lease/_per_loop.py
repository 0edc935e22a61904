"""One object per running event loop, made on first use and dropped with its loop.

The held leases' renewal clock and release batcher each serve every lease of
one loop: a test or a program that runs several loops gets one of each per loop.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerLoop(Generic[T]):
    """Call it for the running loop's ``T`` (``make()`` on the loop's first call)."""

    __slots__ = ("_found", "_make")

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._found: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = (
            weakref.WeakKeyDictionary()
        )

    def __call__(self) -> T:
        loop = asyncio.get_running_loop()
        found = self._found.get(loop)
        if found is None:
            found = self._found[loop] = self._make()
        return found
