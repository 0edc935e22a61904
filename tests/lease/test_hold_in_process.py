"""``held.run_in_process``: a block's work that never awaits, killed with the lease.

Real child processes under ``MemoryLeases`` on a normal loop: the lease's
faults are the in-memory store's switches, the child's fate is read from
/proc. ``tests/process`` tests the pool itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from leaseworker import (
    ChildProcessDied,
    ConfigError,
    HeldLease,
    LeaseLost,
    LeaseTimeout,
    ProcessPool,
    hold,
)
from leaseworker.testing import MemoryLeases, RenewalFault
from tests import process_work
from tests.waiting import eventually


@pytest.fixture
async def pool() -> AsyncIterator[ProcessPool]:
    """One warm worker, closed after the test."""
    async with ProcessPool(1) as pool:
        yield pool


async def _lose_once_running(leases: MemoryLeases, marker: Path, how: RenewalFault) -> int:
    """Wait until the child wrote its pid to ``marker``, fail the next renewal; return the pid."""

    async def written() -> bool:
        return await anyio.Path(marker).exists() and await anyio.Path(marker).read_text() != ""

    await eventually(written, within=10)
    leases.fail_renewals(how)
    return int(await anyio.Path(marker).read_text())


async def test_a_call_returns_its_result_and_what_it_cost(pool: ProcessPool) -> None:
    """The child's result comes back; the block counts the call and its cost."""
    async with hold(MemoryLeases(), "k", lease_duration=5, processes=pool) as held:
        assert await held.run_in_process(process_work.add, 2, b=3) == 5
        key, fence, owned = await held.run_in_process(process_work.identity)
    assert (key, fence, owned) == ("k", held.fence, True)
    assert held.process_calls == 2
    assert held.cpu_seconds >= 0
    assert held.peak_memory > 0


async def test_the_calls_of_one_block_carry_one_execution_id(pool: ProcessPool) -> None:
    """A hold() without an attempt names its execution once; another block, another name."""
    leases = MemoryLeases()
    async with hold(leases, "k", lease_duration=5, processes=pool) as held:
        first = await held.run_in_process(process_work.execution)
        assert await held.run_in_process(process_work.execution) == first
    async with hold(leases, "k", lease_duration=5, processes=pool) as held:
        assert await held.run_in_process(process_work.execution) != first


async def test_a_lost_lease_kills_a_child_that_never_looks(
    pool: ProcessPool, tmp_path: Path
) -> None:
    """The child spins without a checkpoint; the rejected renewal kills it before hold() raises."""
    leases = MemoryLeases()
    marker = tmp_path / "pid"
    pid = 0

    async def lose() -> None:
        nonlocal pid
        pid = await _lose_once_running(leases, marker, "rejected")

    with pytest.raises(LeaseLost) as lost:
        async with (
            hold(leases, "k", lease_duration=0.9, processes=pool) as held,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(lose)
            await held.run_in_process(process_work.spin, str(marker))
    assert lost.value.reason == "rejected"
    assert pid
    assert not process_work.alive(pid)  # killed and reaped before hold() raised
    assert held.cpu_seconds > 0  # the killed call's CPU is counted


async def test_the_child_sees_the_loss_at_its_own_checkpoint(
    pool: ProcessPool, tmp_path: Path
) -> None:
    """A child that checks gets LeaseLost there; the block ends lost either way."""
    leases = MemoryLeases()
    marker = tmp_path / "pid"
    with pytest.raises(LeaseLost):
        async with (
            hold(leases, "k", lease_duration=0.9, processes=pool) as held,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(_lose_once_running, leases, marker, "timeout")
            await held.run_in_process(process_work.spin_checking, str(marker))
    assert held.outcome == "lost"


async def test_a_call_once_the_lease_is_lost_uses_no_child(pool: ProcessPool) -> None:
    """After a rejected renewal the next call raises LeaseLost; no worker is used or killed."""
    leases = MemoryLeases(command_timeout=0.1)
    with pytest.raises(LeaseLost):
        async with hold(leases, "k", lease_duration=0.6, processes=pool) as held:
            worker = await held.run_in_process(process_work.pid)
            leases.fail_renewals("rejected")
            with anyio.CancelScope(shield=True):  # the body's cancellation waits for the call
                await eventually(lambda: _not_owned(held), within=5)
                await held.run_in_process(process_work.pid)
    assert held.process_calls == 1
    assert process_work.alive(worker)
    async with hold(MemoryLeases(), "k", lease_duration=5, processes=pool) as held:
        assert await held.run_in_process(process_work.pid) == worker


async def test_a_call_past_max_runtime_uses_no_child(pool: ProcessPool) -> None:
    """A call made once max_runtime is due, its timer not run yet, times out before a child runs.

    The body holds the loop past its runtime bound, so only the call can notice it.
    """
    with pytest.raises(LeaseTimeout):
        async with hold(
            MemoryLeases(), "k", lease_duration=5, max_runtime=0.2, processes=pool
        ) as held:
            worker = await held.run_in_process(process_work.pid)
            due = anyio.current_time() + 0.25
            while anyio.current_time() < due:  # the loop held, as a job's blocking code would
                pass
            await held.run_in_process(process_work.pid)
    assert held.process_calls == 1
    assert process_work.alive(worker)


async def _not_owned(held: HeldLease) -> bool:
    return not held.owned


async def test_renewals_move_the_childs_deadline(pool: ProcessPool) -> None:
    """A call that outlives three lease durations completes: each renewal reached the child."""
    leases = MemoryLeases(command_timeout=0.1)
    async with hold(leases, "k", lease_duration=0.6, processes=pool) as held:
        least = await held.run_in_process(process_work.outlive, 1.8)
    assert held.outcome == "completed"
    assert held.renewals >= 3
    assert least > 0


async def test_a_child_that_dies_by_itself_fails_the_block(pool: ProcessPool) -> None:
    """SIGSEGV in the child is ChildProcessDied; the pool serves the next call."""
    with pytest.raises(ChildProcessDied, match="SIGSEGV"):
        async with hold(MemoryLeases(), "k", lease_duration=5, processes=pool) as held:
            await held.run_in_process(process_work.crash)
    assert held.outcome == "failed"
    async with hold(MemoryLeases(), "k", lease_duration=5, processes=pool) as held:
        assert await held.run_in_process(process_work.add, 1, 1) == 2


async def test_a_margin_too_short_to_kill_a_child_is_refused(pool: ProcessPool) -> None:
    """The kill and the reap must fit between the local deadline and the expiry."""
    with pytest.raises(ConfigError, match="no room to stop a child process"):
        hold(MemoryLeases(margin=0.0), "k", lease_duration=5, processes=pool)
