"""Run ``leaseworker`` to its end, bounded, and read its one-line refusal."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass

from ..pods import LEASEWORKER, REPO

JOB = "tests.jobs:MarkerJob"


@dataclass(frozen=True)
class Ended:
    """A finished command: exit code, output and how long it took."""

    code: int
    stdout: str
    stderr: str
    seconds: float

    def refusal(self) -> str:
        """Check the command exited 2, without a traceback, in time; return its last line."""
        assert self.code == 2, self.stderr[-3000:]
        assert "Traceback" not in self.stderr, self.stderr[-3000:]
        shown = [line for line in self.stderr.splitlines() if " DEBUG " not in line]
        assert self.seconds < 10, f"took {self.seconds:.1f}s: " + "\n".join(shown[-20:])
        return self.stderr.strip().splitlines()[-1]


def leaseworker(*argv: str, env: dict[str, str] | None = None, timeout: float = 60) -> Ended:
    """Run ``leaseworker ARGV`` to its end (bounded), capturing its output."""
    full_env = {**os.environ, **(env or {})}
    started = time.monotonic()
    result = subprocess.run(
        [LEASEWORKER, *argv],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Ended(result.returncode, result.stdout, result.stderr, time.monotonic() - started)


def run_pod(*flags: str, env: dict[str, str] | None = None) -> Ended:
    """Run ``leaseworker --log-level DEBUG run FLAGS tests.jobs:MarkerJob`` to its end."""
    return leaseworker("--log-level", "DEBUG", "run", *flags, JOB, env=env)
