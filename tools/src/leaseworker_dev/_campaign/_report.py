"""The campaign's report: the verdicts as PASS/FAIL lines, the figures, the seed and its replay.

:func:`render` is what the command prints; :func:`to_json` the ``--report``
document (the same facts, for CI to keep); :func:`to_html` the ``--html``
timeline of the keys with the faults overlaid, drawn by the shared timeline
component.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from typing import Any

from leaseworker.toolkit import render_html

from ._campaign_run import Result


def faults_by_kind(result: Result) -> dict[str, int]:
    """Count the faults played, by kind."""
    return dict(sorted(Counter(f.kind for f in result.history.faults).items()))


def child_cpu(result: Result) -> dict[str, Any] | None:
    """CPU seconds the executions' ``run_in_process`` children spent: committed or wasted.

    ``committed``: executions whose completion the store accepted; ``wasted``:
    every other execution that ran a child (lost, timed out, stale, a
    duplicate, failed, cancelled, or open-ended: its pod was killed), by
    outcome. ``None`` when no execution ran a child.
    """
    ran = [e for e in result.history.executions if e.cpu_seconds is not None]
    if not ran:
        return None
    wasted: dict[str, float] = {}
    counts: Counter[str] = Counter()
    committed = 0.0
    for execution in ran:
        assert execution.cpu_seconds is not None
        if execution.completion == "accepted":
            committed += execution.cpu_seconds
            continue
        ended = execution.completion if execution.completion in ("stale", "duplicate") else None
        label = ended or execution.outcome or "open-ended"
        wasted[label] = wasted.get(label, 0.0) + execution.cpu_seconds
        counts[label] += 1
    return {
        "executions": len(ran),
        "committed_seconds": round(committed, 3),
        "wasted_seconds": round(sum(wasted.values()), 3),
        "wasted_executions": sum(counts.values()),
        "wasted_by_outcome": {k: round(v, 3) for k, v in sorted(wasted.items())},
    }


def _cpu_line(cpu: dict[str, Any]) -> str:
    parts = ", ".join(f"{k} {v:.1f}s" for k, v in cpu["wasted_by_outcome"].items())
    return (
        f"  child CPU      {cpu['committed_seconds']:.1f}s committed, "
        f"{cpu['wasted_seconds']:.1f}s in {cpu['wasted_executions']} executions that did not "
        f"commit{f' ({parts})' if parts else ''}"
    )


def render(result: Result) -> str:
    """Return the printed report: one PASS/FAIL line per invariant, then the figures."""
    settings = result.settings
    kinds = ", ".join(f"{k} {n}" for k, n in faults_by_kind(result).items())
    lines = [
        f"== leaseworker chaos {settings.job}: seed {settings.seed}, {settings.topology}, "
        f"{settings.pods} pods, store {result.store}",
        f"  faults played  {len(result.history.faults)} ({kinds}); {result.skipped} not played "
        "(their target was down or idle: no job to stall, no effect to refuse, no claim to lapse; "
        "or Sentinel aborted every failover asked of it)",
        f"  triggers       {len(result.records.produced)} sent, "
        f"{len(result.history.executions)} executions recorded",
        *([f"  exercised      {result.exercised.line()}"] if result.exercised else []),
        *([_cpu_line(cpu)] if (cpu := child_cpu(result)) else []),
        *(f"  note           {note}" for note in result.notes),
        *(verdict.line() for verdict in result.verdicts),
        f"  wall time      {result.wall:.1f}s",
        f"  replay         {settings.replay()}",
    ]
    if result.workdir is not None:
        lines.append(f"  kept           pod logs and histories in {result.workdir}")
    lines.append(f"  result         {verdict(result)}")
    return "\n".join(lines)


def verdict(result: Result) -> str:
    """``PASS``, ``FAIL``, or ``INCONCLUSIVE: why`` (a violation outranks inconclusive)."""
    if not all(v.passed for v in result.verdicts):
        return "FAIL"
    return "PASS" if result.inconclusive is None else f"INCONCLUSIVE: {result.inconclusive}"


def to_json(result: Result) -> str:
    """Return the ``--report`` document: seed, replay command, faults, verdicts, figures."""
    settings = result.settings
    document: dict[str, Any] = {
        "format": "leaseworker.chaos/1",
        "job": settings.job,
        "seed": settings.seed,
        "replay": settings.replay(),
        "topology": settings.topology,
        "pods": settings.pods,
        "store": result.store,
        "ok": result.ok,
        "wall_seconds": round(result.wall, 1),
        "faults_planned": len(result.plan.faults),
        "faults_played": len(result.history.faults),
        "faults_not_played": result.skipped,
        "faults_by_kind": faults_by_kind(result),
        "triggers": len(result.records.produced),
        "executions": len(result.history.executions),
        "exercised": None if result.exercised is None else asdict(result.exercised),
        "inconclusive": result.inconclusive,
        "effects": len(result.records.outbox),
        "child_cpu": child_cpu(result),
        "notes": result.notes,
        "invariants": [asdict(v) for v in result.verdicts],
        "faults": [asdict(f) for f in result.history.faults],
    }
    return json.dumps(document, indent=2, allow_nan=False)


def to_html(result: Result) -> str:
    """Return the timeline page of the campaign's history, faults overlaid."""
    settings = result.settings
    title = f"leaseworker chaos {settings.job}, seed {settings.seed}"
    return render_html(result.history, title=title)
