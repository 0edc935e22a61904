"""Pod pods as real ``leaseworker run`` processes: the one pod process, and what they record."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import anyio

from leaseworker.toolkit import Execution, History
from leaseworker_dev._services import PodProcess, histories, pod_process

REPO = Path(__file__).resolve().parents[1]
SESSION_TIMEOUT = 6.0
"""The consumer group session of the pods the pod tests start (seconds)."""
LEASE = 3.0
"""Their lease (``LW_TEST_LEASE``, seconds), unless a test gives its own."""
LEASEWORKER = str(Path(sys.executable).parent / "leaseworker")


"""The suite's pods are the one pod process the demo and the campaign use too."""


def spawn_pod(name: str, workdir: Path, env: dict[str, str], *extra: str) -> PodProcess:
    """Start ``leaseworker run tests.jobs:MarkerJob`` as pod ``name``.

    It records its history (``pod.recorded()``) and serves ``/readyz`` on a
    loopback port (``pod.assigned()``, ``pod.readiness()``).
    """
    return spawn(name, "tests.jobs:MarkerJob", workdir, env, *extra, evidence=True)


def spawn(
    name: str,
    job: str,
    workdir: Path,
    env: dict[str, str],
    *extra: str,
    log_level: str = "INFO",
    evidence: bool = False,
) -> PodProcess:
    """Start ``leaseworker run JOB`` as pod ``name`` from the repository, logging to ``workdir``.

    ``evidence``: record the history and serve ``/readyz`` (else the test's flags decide).
    """
    pod = pod_process(
        name,
        job,
        workdir=workdir,
        flags=extra,
        env={**env, "LEASEWORKER_POD": name},
        cwd=REPO,
        record_history=evidence,
        health=evidence,
        log_level=log_level,
    )
    return pod.start()


async def ready(pod: PodProcess, *, idle: bool = False) -> bool:
    """Whether ``/readyz`` says ready, holding a partition (or, ``idle``, holding none)."""
    answer = await anyio.to_thread.run_sync(pod.readiness)
    if answer is None or answer["status"] != "ready":
        return False
    held = int(answer["kafka"]["assigned_partitions"])
    return held == 0 if idle else held > 0


async def holding(pod: PodProcess) -> bool:
    """Whether ``/readyz`` says the pod holds a trigger (running, or waiting on a lease)."""
    answer = await anyio.to_thread.run_sync(pod.readiness)
    return answer is not None and int(answer["kafka"]["in_flight"]) > 0


def recorded(pods: Sequence[PodProcess]) -> list[Execution]:
    """Every execution the pods recorded so far (one monotonic clock), in start order."""
    return sorted(histories(pods).executions, key=lambda e: e.start)


def overlapping(
    executions: Sequence[Execution], *, killed_at: Mapping[str, float] | None = None
) -> list[str]:
    """Job keys with two executions that held the lease at once (``History.overlapping``).

    An execution without an end ran until its pod was killed (``killed_at``), or still runs.
    """
    killed = killed_at or {}
    ended = tuple(
        replace(e, end=killed[e.pod]) if e.end is None and e.pod in killed else e
        for e in executions
    )
    pairs = History(executions=ended).overlapping(until=math.inf)
    return sorted({first.job_key for first, _ in pairs})
