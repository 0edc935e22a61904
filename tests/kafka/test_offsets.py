"""OffsetTracker: only the contiguous completed prefix of a partition is committable."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from leaseworker._kafka._offsets import OffsetTracker

pytestmark = pytest.mark.fake


def test_nothing_is_committable_until_the_first_offset_finishes() -> None:
    """Later completions never jump over an execution still in flight."""
    tracker = OffsetTracker()
    for offset in (5, 6, 9):
        tracker.add(offset)
    tracker.done(9)
    tracker.done(6)
    assert tracker.committable() is None
    tracker.done(5)
    assert tracker.committable() == 10
    assert tracker.in_flight == 0


def test_the_position_is_past_the_last_finished_offset_of_the_prefix() -> None:
    """Commit offset + 1 of the prefix's last record, with gaps allowed."""
    tracker = OffsetTracker()
    for offset in (3, 7, 8):
        tracker.add(offset)
    tracker.done(3)
    assert tracker.committable() == 4
    tracker.done(8)
    assert tracker.committable() == 4
    tracker.committed(4)
    assert tracker.committable() is None  # committed once, not again
    tracker.done(7)
    assert tracker.committable() == 9


def test_offsets_out_of_order_or_unknown_are_rejected() -> None:
    """Adding a lower offset or finishing one never added is a bug, not a silent skip."""
    tracker = OffsetTracker()
    tracker.add(4)
    with pytest.raises(ValueError, match="out of order"):
        tracker.add(4)
    with pytest.raises(ValueError, match="not in flight"):
        tracker.done(3)
    tracker.done(4)
    with pytest.raises(ValueError, match="not in flight"):
        tracker.done(4)
    with pytest.raises(ValueError, match="out of order"):
        tracker.add(2)


@given(st.permutations(range(12)), st.integers(0, 12))
def test_committable_is_always_the_completed_prefix(order: list[int], finished: int) -> None:
    """For any completion order, the position is the first unfinished offset."""
    tracker = OffsetTracker()
    for offset in range(12):
        tracker.add(offset)
    done = set(order[:finished])
    for offset in order[:finished]:
        tracker.done(offset)
    prefix = next((o for o in range(12) if o not in done), 12)
    assert tracker.committable() == (prefix if prefix else None)
    assert tracker.in_flight == 12 - finished
