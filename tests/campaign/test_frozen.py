"""Which executions a freeze struck: those count as paused, their late stops only counted.

Seen in a 1,000-fault run (seed 3, single): pod-1 sent an acquire, then a
job's start stalled its loop for 7.6 s, more than the 6 s lease; the
acquire's answer was read after the stall, so the execution *started* 1 ms
after the stall ended, was lost at once (``loop_blocked``) and stopped 1.6 s
after Redis could expire its key. The freeze was on when the lease ran out:
the execution is paused, as one whose body the stall froze.
"""

from __future__ import annotations

import pytest

from leaseworker.testing import Step
from leaseworker.toolkit import Execution, FaultWindow
from leaseworker_dev._campaign._witness import _judged

pytestmark = pytest.mark.fake


def _late(start: float) -> Execution:
    """Lost at once, stopped 10 ms after ``start``, 1,603 ms after its lease could expire."""
    return Execution(
        job_key="report:tenant-1:2026-11",
        execution_id="e1",
        pod="pod-1",
        start=start,
        end=start + 0.01,
        fence=7,
        outcome="lost",
        reason="loop_blocked",
        steps=(
            Step(at=start, name="acquired"),
            Step(at=start + 0.001, name="lost", attrs={"reason": "loop_blocked"}),
            Step(
                at=start + 0.01, name="stopped", attrs={"latency_ms": 1713.1, "margin_ms": -1603.2}
            ),
        ),
    )


def test_a_stall_on_when_the_lease_ran_out_marks_an_execution_started_after_it_paused() -> None:
    """The stall ended 1 ms before the start, after the expiry (start + 10 ms - 1.6 s): paused."""
    stall = FaultWindow(kind="loop_stall", start=0.0, end=7.599, target="pod-1")
    assert _judged(_late(7.6), [], [stall]).paused


def test_a_stall_over_before_the_lease_ran_out_does_not_excuse_a_late_stop() -> None:
    """A stall that ended before the expiry, or on another pod, leaves the execution unpaused."""
    earlier = FaultWindow(kind="loop_stall", start=0.0, end=5.0, target="pod-1")
    elsewhere = FaultWindow(kind="loop_stall", start=0.0, end=7.599, target="pod-2")
    assert not _judged(_late(7.6), [], [earlier, elsewhere]).paused
