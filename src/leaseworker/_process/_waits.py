"""Whether this process is waiting on a child right now: real time a virtual clock must keep.

A :class:`~leaseworker.testing.VirtualTimeLoop` jumps its clock to the next
timer whenever every task waits; a child computing is real time passing, so
while one is awaited (its start, a call, its reap) the loop sleeps for real
and moves its clock by what passed (``testing/_clock.py`` asks here).
"""

from __future__ import annotations

from typing import Final

_awaited = 0


class _OnChild:
    """The context manager ``on_child`` returns: a class, cheaper than a generator on every call."""

    __slots__ = ()

    def __enter__(self) -> None:
        global _awaited
        _awaited += 1

    def __exit__(self, *exc_info: object) -> None:
        global _awaited
        _awaited -= 1


_ON_CHILD: Final = _OnChild()


def on_child() -> _OnChild:
    """Count the enclosed await as a wait on a child process."""
    return _ON_CHILD


def awaiting_children() -> bool:
    """Whether some task of this process awaits a child process now."""
    return _awaited > 0
