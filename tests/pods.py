"""Worker pods as real ``leaseworker run`` processes (the one pod process), and their markers."""

from __future__ import annotations

import itertools
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from leaseworker._dev._pods import PodProcess, pod_process

REPO = Path(__file__).resolve().parents[1]
LEASEWORKER = str(Path(sys.executable).parent / "leaseworker")


Pod = PodProcess
"""The suite's pods are the one pod process the demo and the campaign use too."""


@dataclass
class Mark:
    """One line of the marker file: an execution started or stopped."""

    at: float
    pod: str
    key: str
    execution_id: str
    what: str  # "start" or "stop"
    how: str  # for stops: completed or cancelled


def spawn_pod(name: str, workdir: Path, env: dict[str, str], *extra: str) -> Pod:
    """Start ``leaseworker run tests.jobs:MarkerJob`` as pod ``name``."""
    return spawn(name, "tests.jobs:MarkerJob", workdir, env, *extra)


def spawn(
    name: str, job: str, workdir: Path, env: dict[str, str], *extra: str, log_level: str = "INFO"
) -> Pod:
    """Start ``leaseworker run JOB`` as pod ``name`` from the repository, logging to ``workdir``."""
    pod = pod_process(
        name,
        job,
        workdir=workdir,
        flags=extra,
        env={**env, "LEASEWORKER_POD": name},
        cwd=REPO,
        record_history=False,
        health=False,
        log_level=log_level,
    )
    return pod.start()


def read_marks(path: Path) -> list[Mark]:
    """Parse the marker file (missing file: no marks yet)."""
    if not path.exists():
        return []
    marks = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5:
            how = parts[5] if len(parts) > 5 else ""
            marks.append(Mark(float(parts[0]), parts[1], parts[2], parts[3], parts[4], how))
    return marks


def intervals(
    marks: list[Mark], *, killed_at: dict[str, float] | None = None
) -> dict[str, list[tuple[float, float, str]]]:
    """Per job key, each execution's (start, stop, pod); a killed pod's runs end at the kill."""
    starts = {m.execution_id: m for m in marks if m.what == "start"}
    stops = {m.execution_id: m for m in marks if m.what == "stop"}
    result: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for execution_id, start in starts.items():
        stop = stops.get(execution_id)
        end = stop.at if stop else (killed_at or {}).get(start.pod, float("inf"))
        result[start.key].append((start.at, end, start.pod))
    for runs in result.values():
        runs.sort()
    return result


def overlapping(runs_by_key: dict[str, list[tuple[float, float, str]]]) -> list[str]:
    """Job keys with two executions whose [start, stop] intervals overlap."""
    bad = []
    for key, runs in runs_by_key.items():
        if any(later[0] < earlier[1] for earlier, later in itertools.pairwise(runs)):
            bad.append(key)
    return bad
