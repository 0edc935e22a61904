"""``leaseworker chaos`` run as a user runs it: a subprocess, stopped by SIGINT past its budget."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

LEASEWORKER = str(Path(sys.executable).parent / "leaseworker")
REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
CAMPAIGNS = pytest.mark.xdist_group("campaigns")
"""Whole campaigns (pods, services, faults) run one at a time in one worker: each loads
the machine, and two at once slowed timing tests elsewhere past their bounds."""


def chaos(*args: str, cwd: Path = BENCH, budget: float) -> tuple[int, str, str]:
    """Run ``leaseworker chaos ARGS`` in ``cwd``; its exit code, stdout and stderr.

    Past ``budget`` seconds it gets SIGINT, as a user's Ctrl-C (SIGKILL, subprocess.run's
    way, would leave its pods, services and hosts running), and TimeoutExpired is raised.
    """
    with subprocess.Popen(
        [LEASEWORKER, "chaos", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as campaign:
        try:
            stdout, stderr = campaign.communicate(timeout=budget)
        except subprocess.TimeoutExpired:
            campaign.send_signal(signal.SIGINT)
            campaign.communicate(timeout=60)
            raise
    return campaign.returncode, stdout, stderr
