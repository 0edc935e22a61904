"""Which offset of a partition may be committed: the contiguous completed prefix.

Executions of one partition finish in any order, but Kafka stores one position
per partition and everything before it counts as done. So the committable
position is just past the last offset whose predecessors (among the offsets
this pod was handed) all reached a terminal outcome. Pure bookkeeping, no
Kafka: the source feeds it offsets and asks what to commit.
"""

from __future__ import annotations

from collections import deque
from typing import final


@final
class OffsetTracker:
    """Track dispatched and finished offsets of one partition.

    ::

        tracker = OffsetTracker()
        tracker.add(5); tracker.add(6); tracker.add(9)
        tracker.done(6)
        tracker.committable()   # None: 5 still runs
        tracker.done(5)
        tracker.committable()   # 7, i.e. commit({tp: 7}); 9 is still in flight

    Offsets must be added in increasing order (the order Kafka delivers them);
    gaps (compaction, transaction markers) are fine.
    """

    def __init__(self) -> None:
        self._pending: deque[int] = deque()
        self._finished: set[int] = set()
        self._position: int | None = None
        self._committed: int | None = None

    @property
    def in_flight(self) -> int:
        """How many added offsets have not finished yet."""
        return len(self._pending) - len(self._finished)

    def add(self, offset: int) -> None:
        """Record that ``offset`` was handed to an execution."""
        floor = self._pending[-1] + 1 if self._pending else self._position
        if floor is not None and offset < floor:
            raise ValueError(f"offset {offset} added out of order: offsets must increase")
        self._pending.append(offset)

    def done(self, offset: int) -> None:
        """Record that ``offset`` reached a terminal outcome; advance the prefix."""
        if offset not in self._pending or offset in self._finished:
            raise ValueError(f"offset {offset} is not in flight")
        self._finished.add(offset)
        while self._pending and self._pending[0] in self._finished:
            head = self._pending.popleft()
            self._finished.discard(head)
            self._position = head + 1

    def committable(self) -> int | None:
        """Return the position to commit now (next offset to read), or ``None``."""
        if self._position is None or self._position == self._committed:
            return None
        return self._position

    def committed(self, position: int) -> None:
        """Record that ``position`` was committed, so it is not committed again."""
        self._committed = position
