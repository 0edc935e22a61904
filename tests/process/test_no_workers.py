"""A pool of 0 workers (``--process-workers 0``): no process at all, and a clear refusal."""

from __future__ import annotations

import os
import threading
from typing import ClassVar

import pytest

from leaseworker import ConfigError, JobContext, PodConfig, ProcessPool, ReportJob, hold
from leaseworker.testing import JobEnvironment, MemoryLeases, make_trigger
from tests import process_work
from tests.process.util import Call
from tests.processes import stats

REFUSAL = "run_in_process(add) has no process worker to run in: the pool has 0 (--process-workers 0"


class AddJob(ReportJob):
    """Adds the payload's two numbers in a child."""

    topic: ClassVar[str] = "add"

    async def run(self, ctx: JobContext) -> object:
        """Return the child's sum."""
        return await ctx.run_in_process(process_work.add, *ctx.trigger.payload["add"])


def _children() -> set[int]:
    return {pid for pid, parent, _ in stats() if parent == os.getpid()}


async def test_a_pool_of_0_starts_nothing_and_refuses_every_call_in_one_line() -> None:
    """Not even the keeper starts; a call is refused before its arguments are looked at."""
    before = _children()
    async with ProcessPool(0) as pool:
        assert pool.workers == 0
        assert _children() == before
        with pytest.raises(ConfigError) as refused:
            await Call().run(pool, process_work.add, threading.Lock(), 2)  # unpicklable: unread
    assert str(refused.value).startswith(REFUSAL)
    assert "\n" not in str(refused.value)
    async with ProcessPool(1) as pool:  # the count above could see a started pool
        assert len(_children() - before) == 2  # the worker and the keeper


@pytest.mark.parametrize("workers", [-1, True, 1.5])
def test_a_pool_of_fewer_than_0_or_not_whole_workers_is_refused(workers: object) -> None:
    """0 is the least; a bool or a float is not a number of workers."""
    with pytest.raises(ConfigError, match="workers must be a whole number >= 0"):
        ProcessPool(workers)  # type: ignore[arg-type]


async def test_a_hold_without_workers_needs_no_stop_room_and_fails_its_call() -> None:
    """No child can outlive the lease, so a margin of 0 is fine; the call fails the block."""
    with pytest.raises(ConfigError, match="has no process worker"):
        async with hold(
            MemoryLeases(margin=0.0), "k", lease_duration=5, processes=ProcessPool(0)
        ) as held:
            await held.run_in_process(process_work.add, 1, 2)
    assert (held.outcome, held.process_calls) == ("failed", 0)


async def test_a_job_that_calls_run_in_process_without_workers_fails_its_execution() -> None:
    """As a pod with ``--process-workers 0`` runs it: failed, the refusal its error."""
    env = JobEnvironment(AddJob(), processes=ProcessPool(0))
    result = await env.run(make_trigger({"jobId": "r-1", "add": [1, 2]}))
    assert (result.outcome, result.terminal, result.completion) == ("failed", True, None)
    assert isinstance(result.error, ConfigError)
    assert str(result.error).startswith(REFUSAL)


def test_pod_config_takes_0_process_workers_and_refuses_fewer() -> None:
    """0 is a pod without a pool; below it is a ConfigError naming the field."""
    assert PodConfig(process_workers=0).process_workers == 0
    with pytest.raises(ConfigError, match="process_workers must be None or >= 0, got -1"):
        PodConfig(process_workers=-1)
