"""The keeper, driven directly: it kills a group once its leader is gone, however late it heard."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from leaseworker._process import _keeper
from tests.process_work import alive
from tests.waiting import eventually


@contextmanager
def keeper() -> Iterator[subprocess.Popen[bytes]]:
    """A keeper process as the pool starts it; closed (EOF) and reaped after."""
    process = subprocess.Popen(
        [sys.executable, "-I", "-S", _keeper.__file__], stdin=subprocess.PIPE
    )
    try:
        yield process
    finally:
        assert process.stdin is not None
        process.stdin.close()
        assert process.wait(10) == 0


def leader() -> tuple[subprocess.Popen[bytes], int]:
    """A shell in a session of its own that started a sleeping member of its group.

    It exits when its stdin closes; returns it and the member's pid.
    """
    process = subprocess.Popen(
        ["sh", "-c", "sleep 60 & echo $!; read line || :"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert process.stdout is not None
    member = int(process.stdout.readline())
    process.stdout.close()
    return process, member


def say(keeper: subprocess.Popen[bytes], line: bytes) -> None:
    """Write one line of the pod's protocol to ``keeper``."""
    assert keeper.stdin is not None
    keeper.stdin.write(line)
    keeper.stdin.flush()


async def member_dies(pid: int) -> None:
    """Return once ``pid`` no longer runs; fail after a second."""

    async def dead() -> bool:
        return not alive(pid)

    await eventually(dead, within=1.0)


async def test_a_leader_that_exits_by_itself_has_its_group_killed() -> None:
    """The leader exits (status 0, not reaped): the keeper, on its pidfd, kills the member."""
    with keeper() as watching:
        shell, member = leader()
        try:
            say(watching, b"+%d\n" % shell.pid)
            assert shell.stdin is not None
            shell.stdin.close()  # the shell exits; this test, its parent, does not reap it yet
            await member_dies(member)
            assert shell.wait(10) == 0
        finally:
            shell.kill()
            shell.wait()


async def test_a_leader_reaped_before_the_keeper_heard_of_it_has_its_group_killed() -> None:
    """``+PGID`` of a reaped leader (pidfd_open fails, ESRCH): its group is killed at once."""
    with keeper() as watching:
        shell, member = leader()
        assert shell.stdin is not None
        shell.stdin.close()
        assert shell.wait(10) == 0  # reaped: the member alone keeps the group's id in use
        assert alive(member)
        say(watching, b"+%d\n" % shell.pid)
        await member_dies(member)
