"""The stack demo end to end: real Redis, Kafka and pod processes (about 25-40 s)."""

from __future__ import annotations

from leaseworker._dev._services import LocalJaeger
from leaseworker._dev._stack import SLOW_KEY, stack_demo


def test_stack_demo_completes_every_trigger_without_overlap_and_takes_the_stall_over() -> None:
    """Overlap 0, every trigger completed and committed, the stalled report lost and taken over.

    The stalled pod's execution of the slow report must have stopped as
    ``lost`` before any other pod started it, and another pod must have
    completed it afterwards.
    """
    LocalJaeger.ensure_built()  # the demo exports to Jaeger when it is there: make it be
    lines: list[str] = []
    summary = stack_demo(lines.append)
    assert summary.overlapping == 0, lines
    assert summary.triggers == 17
    assert summary.completed_triggers == summary.committed == summary.triggers
    assert summary.duplicates == 4
    assert summary.answered_duplicates >= 1  # answered from the completion store, not run
    slow = [e for e in summary.executions if e.key == "report:{}:{}".format(*SLOW_KEY)]
    stalled = [e for e in slow if e.pod == summary.stall_pod]
    others = [e for e in slow if e.pod != summary.stall_pod]
    assert [e.how for e in stalled] == ["lost"]
    assert [e.how for e in others] == ["completed"]
    assert others[0].start >= stalled[0].end
    assert summary.loss_after is not None
    assert summary.loss_after < 3.0  # stopped within one lease duration of the stall
    assert summary.takeover_after is not None
    assert summary.ok
    assert summary.lost_trace is not None  # the demo exported traces to a local Jaeger
    assert "/trace/" in summary.lost_trace
    assert "result               OK" in summary.render()
