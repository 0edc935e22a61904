"""Worker pods as real ``leaseworker run`` processes, and the marker files they write."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import anyio

REPO = Path(__file__).resolve().parents[1]
LEASEWORKER = str(Path(sys.executable).parent / "leaseworker")


@dataclass
class Pod:
    """One ``leaseworker run`` process, its log file and name."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def signal(self, signum: int) -> None:
        """Send ``signum`` to this pod's process."""
        self.process.send_signal(signum)

    def log_text(self) -> str:
        """Everything the pod logged so far."""
        return self.log.read_text(errors="replace")

    async def wait_exit(self, within: float) -> int:
        """Wait for the process to exit (polled: it is another process); return its code."""
        with anyio.fail_after(within):
            while (code := self.process.poll()) is None:  # noqa: ASYNC110 - a child process
                await anyio.sleep(0.05)
        return code

    def kill(self) -> None:
        """SIGKILL the pod if it still runs, and reap it."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)


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
    log = workdir / f"{name}.log"
    full_env = {**os.environ, **env, "LEASEWORKER_POD": name, "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [LEASEWORKER, "--log-level", "INFO", "run", "tests.jobs:MarkerJob", *extra],
            cwd=REPO,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Pod(name, process, log)


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
