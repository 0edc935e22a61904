"""The ``sentinel_failover`` fault against a real Sentinel group that aborts every failover.

Sentinel accepts ``SENTINEL FAILOVER`` and may give up later; the local
group then raises ``FailoverAborted``. The campaign's injector counts that
fault as not played (the master never changed) and leaves the group settled,
instead of breaking the campaign off.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from leaseworker_dev._campaign._fault_play import Injector
from leaseworker_dev._campaign._plan import PlannedFault
from leaseworker_dev._campaign._testbed import Services
from leaseworker_dev._services import LocalSentinelGroup, LocalStack

from ..topologies import direct, promotion_refused, role


@pytest.mark.timeout(180)
async def test_a_failover_sentinel_aborts_every_time_is_a_fault_not_played(
    local_stack: LocalStack, sentinel_group: LocalSentinelGroup, tmp_path: Path
) -> None:
    """Every attempt aborted: the fault is in ``skipped``, not in ``faults``; the master stays."""
    old = await sentinel_group.settle()
    replicas = [node for node in sentinel_group.servers if node is not old]
    stack = Services(stack=local_stack, workdir=tmp_path, store_url="")
    injector = Injector(stack=stack, pods={}, lease=1.0)
    planned = PlannedFault(kind="sentinel_failover", at=0.0, duration=0.0)
    async with promotion_refused(replicas):
        await injector.play(planned)
    assert (injector.skipped, injector.faults) == ([planned], [])
    assert await sentinel_group.master() is old
    for node in replicas:
        async with direct(node) as client:
            assert await role(client) == (b"slave", old.port)
