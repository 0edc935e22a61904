"""``JobEnvironment`` runs jobs whose work goes through ``ctx.run_in_process``, in real children."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar

import pytest

from leaseworker import JobContext, ProcessPool, ReportJob
from leaseworker.testing import (
    FailRenewal,
    JobEnvironment,
    MemoryLeases,
    make_trigger,
    run_in_virtual_time,
)
from tests import process_work


class CrunchJob(ReportJob):
    """Burns ``seconds`` of CPU in a child, checking its lease there."""

    topic: ClassVar[str] = "crunch"
    lease_duration: ClassVar[float] = 0.6

    async def run(self, ctx: JobContext) -> object:
        """Return the least ``remaining()`` the child saw."""
        seconds = float(ctx.trigger.payload["seconds"])
        return {"least": await ctx.run_in_process(process_work.outlive, seconds)}


class CrashJob(ReportJob):
    """Its child dies of SIGSEGV."""

    topic: ClassVar[str] = "crash"

    async def run(self, ctx: JobContext) -> object:
        """Crash in the child."""
        return await ctx.run_in_process(process_work.crash)


@pytest.fixture
async def pool() -> AsyncIterator[ProcessPool]:
    """One warm worker, closed after the test."""
    async with ProcessPool(1) as pool:
        yield pool


async def test_a_job_completes_with_its_childs_result_and_cost(pool: ProcessPool) -> None:
    """Renewed across the child's second of CPU; JobResult reports what it cost."""
    env = JobEnvironment(CrunchJob(), leases=MemoryLeases(command_timeout=0.1), processes=pool)
    result = await env.run(make_trigger({"jobId": "r-1", "seconds": 1.0}))
    assert (result.outcome, result.completion) == ("completed", "accepted")
    assert result.result["least"] > 0
    assert result.cpu_seconds is not None
    assert result.cpu_seconds > 0  # it did burn CPU (how much depends on the load)
    assert result.peak_memory is not None
    assert result.peak_memory > 0


async def test_a_renewal_failing_while_the_child_computes_kills_it(pool: ProcessPool) -> None:
    """The first renewal is rejected: the child asked for 30 s and is killed at once."""
    env = JobEnvironment(CrunchJob(), leases=MemoryLeases(command_timeout=0.1), processes=pool)
    result = await env.run(
        make_trigger({"jobId": "r-2", "seconds": 30.0}), faults=[FailRenewal("rejected")]
    )
    assert (result.outcome, result.reason, result.terminal) == ("lost", "rejected", False)
    assert result.completion is None
    assert result.cpu_seconds is not None
    assert result.cpu_seconds < 5


async def test_a_child_that_dies_by_itself_is_a_failure_dead_lettered(pool: ProcessPool) -> None:
    """SIGSEGV: failed, child_died, dead-lettered job_failed like any failure; never retried."""
    env = JobEnvironment(CrashJob(), processes=pool)
    result = await env.run(make_trigger({"jobId": "r-3"}))
    assert (result.outcome, result.reason, result.dead_letter) == (
        "failed",
        "child_died",
        "job_failed",
    )
    assert result.terminal


def test_run_sync_keeps_real_time_while_a_child_computes() -> None:
    """On virtual time the clock keeps the real pace while a child computes: renewed, completed.

    No pool given: the job's calls go to the process's default pool, closed after.
    """
    env = JobEnvironment(CrunchJob(), leases=MemoryLeases(command_timeout=0.1))
    try:
        result = env.run_sync(make_trigger({"jobId": "r-4", "seconds": 1.0}))
    finally:
        run_in_virtual_time(ProcessPool.default().aclose())
    assert (result.outcome, result.completion) == ("completed", "accepted")
    assert len(result.of("renewed")) >= 3  # 0.6 s lease, renewed every 0.2 s of the child's 1 s
