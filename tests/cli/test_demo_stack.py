"""The stack demo end to end: real Redis, Kafka and pod processes (about 25-40 s)."""

from __future__ import annotations

from pathlib import Path

from leaseworker_dev._demos import stack_demo
from leaseworker_dev._demos._stack_demo import SLOW_KEY
from leaseworker_dev._services import LocalJaeger


def test_stack_demo_completes_every_trigger_without_overlap_and_takes_the_stall_over(
    tmp_path: Path,
) -> None:
    """Overlap 0, every trigger completed and committed, the stalled report lost and taken over.

    The stalled pod's execution of the slow report must have stopped as
    ``lost`` before any other pod acquired it, and another pod must have
    completed it afterwards (read from the histories the pods recorded). The
    summary ends with that report's timeline, read back from Jaeger: both
    pods, the loss and the takeover, overlap 0; its page is written where asked.
    Every report's ``reports.ready`` notification, committed with its
    completion, reached the example receiver exactly once; the takeover's
    timeline marks its notification committed and sent.
    """
    LocalJaeger.ensure_built()  # the demo exports to Jaeger when it is there: make it be
    lines: list[str] = []
    page = tmp_path / "timeline.html"
    summary = stack_demo(lines.append, html=page)
    assert summary.overlapping == 0, lines
    assert summary.triggers == 17
    assert summary.completed_triggers == summary.committed == summary.triggers
    assert summary.duplicates == 4
    assert summary.answered_duplicates >= 1  # answered from the completion store, not run
    slow = [e for e in summary.executions if e.job_key == "report:{}:{}".format(*SLOW_KEY)]
    stalled = [e for e in slow if e.pod == summary.stall_pod]
    others = [e for e in slow if e.pod != summary.stall_pod]
    # Lost, all of them: a renewal lost to a loaded machine before the stall is retried there.
    assert {e.outcome for e in stalled} == {"lost"}
    assert [e.outcome for e in others] == ["completed"]
    assert stalled[-1].end is not None
    assert others[0].start >= stalled[-1].end
    assert summary.loss_after is not None
    assert 0 <= summary.loss_after < 3.0  # stopped within one lease duration of the stall
    assert summary.takeover_after is not None
    notifications = summary.notifications
    assert notifications is not None
    assert notifications.committed == 13  # one per report: duplicates and re-runs commit none
    assert notifications.delivered_once == notifications.committed
    assert (notifications.stale, notifications.got_through) == (0, 0)
    assert summary.ok
    assert summary.lost_trace is not None  # the demo exported traces to a local Jaeger
    rendered = summary.render()
    assert "result               OK" in rendered
    assert "  notifications        13 committed, 13 delivered once, " in rendered
    assert "Jaeger UI" not in rendered
    assert "has no web UI" in rendered
    assert summary.timeline is not None
    executions = summary.timeline.executions
    assert {e.pod for e in executions} >= {summary.stall_pod, others[0].pod}
    lost = [e for e in executions if e.outcome == "lost"]
    assert {e.pod for e in lost} == {summary.stall_pod}
    [taker] = [e for e in executions if e.previous_execution_id == lost[-1].execution_id]
    assert taker.pod != summary.stall_pod
    assert taker.outcome == "completed"
    assert {"effect_committed", "effect_sent"} <= {step.name for step in taker.steps}
    timeline = rendered.split("== timeline of the stalled report", 1)[1]
    assert "overlap: 0 ms" in timeline
    assert "renew failed" in timeline
    assert "stopped" in timeline
    [stall] = summary.timeline.faults  # the Redis stall, over the stalled pod
    assert (stall.kind, stall.target) == ("redis stall", summary.stall_pod)
    assert page.read_text().startswith("<!doctype html>")
