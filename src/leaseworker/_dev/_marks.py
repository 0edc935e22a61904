"""The stack demo's evidence: execution markers on one clock, and what they prove.

Each pod's job appends ``<monotonic> <pod> <job key> <execution id>
<partition> <offset> start|stop <how>`` lines to one file (see
``examples/report_job/demo_report.py``). ``time.monotonic()`` is
``CLOCK_MONOTONIC``, shared by every process on the machine, so intervals from
different pods compare directly. This module only reads and judges them.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

Position = tuple[int, int]
"""A trigger's (partition, offset) on the demo topic."""


@dataclass(frozen=True, slots=True)
class Execution:
    """One execution as its markers describe it; ``stop`` is ``None`` while it runs."""

    key: str
    execution_id: str
    pod: str
    position: Position
    start: float
    stop: float | None
    how: str  # completed, lost, cancelled, failed, or "" while running

    @property
    def end(self) -> float:
        """When it stopped; an execution without a stop marker counts as still running."""
        return float("inf") if self.stop is None else self.stop


def read_executions(path: Path) -> list[Execution]:
    """Pair the start and stop markers in ``path`` into executions, in start order."""
    starts: dict[str, list[str]] = {}
    stops: dict[str, list[str]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            fields = line.split()
            if len(fields) == 8:
                (starts if fields[6] == "start" else stops)[fields[3]] = fields
    found = []
    for execution_id, start in starts.items():
        stop = stops.get(execution_id)
        found.append(
            Execution(
                key=start[2],
                execution_id=execution_id,
                pod=start[1],
                position=(int(start[4]), int(start[5])),
                start=float(start[0]),
                stop=float(stop[0]) if stop else None,
                how=stop[7] if stop else "",
            )
        )
    return sorted(found, key=lambda e: e.start)


def overlaps(executions: list[Execution]) -> list[tuple[Execution, Execution]]:
    """Pairs of executions of one job key whose [start, stop] intervals intersect."""
    by_key: dict[str, list[Execution]] = defaultdict(list)
    for execution in executions:
        by_key[execution.key].append(execution)
    bad = []
    for runs in by_key.values():
        for earlier, later in itertools.combinations(sorted(runs, key=lambda e: e.start), 2):
            if later.start < earlier.end:
                bad.append((earlier, later))
    return bad


def completed_positions(executions: list[Execution]) -> set[Position]:
    """Triggers (by position) that at least one execution completed."""
    return {e.position for e in executions if e.how == "completed"}
