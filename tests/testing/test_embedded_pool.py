"""The pytest plugin's embedded pod starts its ``run_in_process`` pool on the job's first call.

A pod whose job has not called it runs no pool process; once it did, the
pool runs, and none of its processes outlives the pod.
"""

from __future__ import annotations

import os
from typing import ClassVar

from leaseworker import JobContext, ReportJob
from leaseworker_dev.pytest_plugin import PodFactory
from tests import process_work
from tests.processes import pool_processes


class MaybeAdd(ReportJob):
    """Adds the payload's ``add`` in a child, if it has one."""  # one send a test: see below

    topic: ClassVar[str] = "unset"  # the factory gives it the test's topic

    async def run(self, ctx: JobContext) -> object:
        """Return the child's sum, or nothing."""
        if "add" in ctx.trigger.payload:
            return await ctx.run_in_process(process_work.add, *ctx.trigger.payload["add"])
        return None


async def test_the_pool_starts_at_the_first_call_and_ends_with_the_pod(
    leaseworker_pod: PodFactory,
) -> None:
    """No pool process while the pod consumes and no job called it; 2 workers and a keeper after."""
    before = pool_processes(os.getpid())
    async with leaseworker_pod(MaybeAdd, config={"process_workers": 2}) as pod:
        assert pool_processes(os.getpid()) == before  # consuming since the block began
        added = await pod.send({"jobId": "r-2", "add": [1, 2]})
        assert (added.outcome, added.result) == ("completed", 3)
        assert len(pool_processes(os.getpid())) == len(before) + 3
    assert pool_processes(os.getpid()) == before
