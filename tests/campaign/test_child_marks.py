"""The campaign's marks invariant on real processes: a killed group passes, an escapee fails.

A call through ``held.run_in_process`` computes with a grandchild, both
marking; cancelling the call kills the group, and the checker, reading the
marks as the campaign does, finds none after the recorded stop. The planted
violation: a grandchild that left the group (its own session) keeps marking
after the stop, and the checker says so.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import anyio

from leaseworker import HeldLease, ProcessPool, RedisLeases, hold
from leaseworker.toolkit import Execution, History
from leaseworker_dev._campaign import Records, check
from leaseworker_dev._campaign._witness import marks
from leaseworker_dev._services import crunch, read_marks

RULE = "no process of an execution ran after it stopped"
ESCAPEE = """\
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
while True:
    os.write(fd, f"{os.getpid()} {time.monotonic():.6f}\\n".encode())
    time.sleep(0.002)
"""


def escaping_crunch(ctx: object, seconds: float, path: str, grandchild: bool) -> int:
    """Start a grandchild in a session of its own (out of the pod's reach), then compute."""
    subprocess.Popen([sys.executable, "-c", ESCAPEE, path], start_new_session=True)
    return crunch(ctx, seconds, path, grandchild)


async def _run_and_cancel(held: HeldLease, fn: Callable[..., int], path: Path) -> float:
    """Call ``fn`` in a child; cancel once all its processes mark; return when the call stopped."""
    processes = 3 if fn is escaping_crunch else 2
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(held.run_in_process, fn, 60.0, str(path), True))
            with anyio.fail_after(30):
                while len(read_marks(path)) < processes:  # noqa: ASYNC110 - other processes
                    await anyio.sleep(0.01)
            scope.cancel()
    return time.monotonic()


async def test_a_killed_group_passes_and_a_grandchild_that_escaped_fails(
    leases: RedisLeases, tmp_path: Path
) -> None:
    """The same invariant, two real runs: the group's marks stop in time, the escapee's do not."""
    directory = tmp_path / "marks"
    directory.mkdir()
    executions: list[Execution] = []
    try:
        async with (
            ProcessPool(1) as pool,
            hold(leases, "marks", lease_duration=10.0, processes=pool) as held,
        ):
            for name, fn in (("kept", crunch), ("escaped", escaping_crunch)):
                began = time.monotonic()
                stopped = await _run_and_cancel(held, fn, directory / name)
                executions.append(
                    Execution(
                        job_key=f"k-{name}",
                        execution_id=name,
                        pod="pod",
                        start=began,
                        end=stopped,
                        outcome="cancelled",
                    )
                )
        await anyio.sleep(0.1)  # the escapee marks on meanwhile
        history = History(clock="monotonic", executions=tuple(executions))
        verdicts = {v.name: v for v in check(history, Records(marks=marks(directory)))}
    finally:
        for pid in read_marks(directory / "escaped"):  # the escapee is ours to stop
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    verdict = verdicts[RULE]
    assert not verdict.passed
    assert verdict.counts["executions"] == 2
    assert verdict.counts["processes"] == 5  # two in the kept group, three in the escaped run
    [violation] = verdict.violations
    assert violation.startswith("k-escaped: escaped (pod): process ")
    assert "after the execution ended (cancelled)" in violation
