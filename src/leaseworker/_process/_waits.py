"""Whether this process is waiting on a child right now: real time a virtual clock must keep.

A :class:`~leaseworker.testing.VirtualTimeLoop` jumps its clock to the next
timer whenever every task waits; a child computing is real time passing, so
while one is awaited (its start, a call, its reap) the loop sleeps for real
and moves its clock by what passed (``testing/_clock.py`` asks here).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

_awaited = 0


@contextlib.contextmanager
def on_child() -> Iterator[None]:
    """Count the enclosed await as a wait on a child process."""
    global _awaited
    _awaited += 1
    try:
        yield
    finally:
        _awaited -= 1


def awaiting_children() -> bool:
    """Whether some task of this process awaits a child process now."""
    return _awaited > 0
