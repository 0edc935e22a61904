"""The marked CPU work and the exit watch the demo, the campaign and the pod tests judge by."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import anyio

from leaseworker_dev._services import ExitWatch, crunch, read_marks

from ..waiting import eventually


def _marking_pids(path: Path) -> set[int]:
    return set(read_marks(path))


async def _two_marking(path: Path) -> bool:
    """Child and grandchild have each marked more than ten times (a loaded machine is slow)."""
    found = read_marks(path)
    return len(found) == 2 and all(len(marks) > 10 for marks in found.values())


async def test_a_killed_group_stops_marking_by_its_exit_time_as_the_kernel_tells_it(
    tmp_path: Path,
) -> None:
    """The child and its grandchild mark until the group is killed; none marks after its exit."""
    marks = tmp_path / "marks"
    program = "import sys; from leaseworker_dev._services import crunch; "
    program += "crunch(None, 60.0, sys.argv[1], True)"
    child = await anyio.open_process(
        [sys.executable, "-c", program, str(marks)], start_new_session=True
    )
    try:
        await eventually(lambda: _two_marking(marks), within=30)
        grandchild = (_marking_pids(marks) - {child.pid}).pop()
        with ExitWatch() as watch:
            assert watch.add(child.pid)
            assert watch.add(grandchild)
            killed = time.monotonic()
            os.killpg(child.pid, signal.SIGKILL)
            child_exit = watch.exited(child.pid, within=10)
            grandchild_exit = watch.exited(grandchild, within=10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        await child.wait()
    assert child_exit is not None
    assert grandchild_exit is not None
    assert killed <= child_exit < killed + 1
    assert killed <= grandchild_exit < killed + 1
    found = read_marks(marks)
    assert max(found[child.pid]) < child_exit
    assert max(found[grandchild]) < grandchild_exit
    assert len(found[child.pid]) > 10  # it marked as it computed, not once


def test_a_finished_crunch_leaves_no_grandchild(tmp_path: Path) -> None:
    """Returning, crunch stops the grandchild it started: nothing marks after the call."""
    marks = tmp_path / "marks"
    crunch(None, 0.2, str(marks), True)
    returned = time.monotonic()
    found = read_marks(marks)
    [grandchild] = set(found) - {os.getpid()}
    with ExitWatch() as watch:
        assert not watch.add(grandchild)  # reaped already
    assert max(max(at) for at in found.values()) < returned


def test_a_running_process_has_no_exit_time() -> None:
    """Nothing is invented: a process that runs on has no exit time after the wait."""
    with ExitWatch() as watch:
        pid = os.getpid()
        assert watch.add(pid)
        assert watch.exited(pid, within=0.05) is None
