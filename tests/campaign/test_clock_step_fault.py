"""The injector's ``redis_clock_step``: the campaign's one Redis runs on a clock the fault steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from leaseworker_dev._campaign._fault_play import Injector
from leaseworker_dev._campaign._plan import PlannedFault
from leaseworker_dev._campaign._testbed import services


async def test_a_clock_step_moves_redis_time_and_records_the_overlap_bound(
    tmp_path: Path,
) -> None:
    """+5 s on the single node, seen by TIME; the window says how long an overlap may last.

    Brokers are given (nothing listens there: no Kafka starts) and the store is
    a file, so only the campaign's Redis runs.
    """
    store = f"sqlite:///{tmp_path / 's.db'}"
    with services("single", store, tmp_path, bootstrap_servers="127.0.0.1:9") as stack:
        assert stack.redis is not None
        assert stack.redis.clock is not None
        client = redis.Redis(port=stack.redis_port)
        before = client.time()
        injector = Injector(stack=stack, pods={}, lease=3.0)
        await injector.play(PlannedFault(kind="redis_clock_step", at=0.0, duration=0.0, size=5.0))
        after = client.time()
        client.close()
    assert _seconds(after) - _seconds(before) == pytest.approx(5.0, abs=0.5)
    [window] = injector.faults
    assert window.kind == "redis_clock_step"
    assert window.attrs == {"step_s": 5.0, "overlap_bound_s": 2.0}  # 1 s renewal + 0.5 + 0.5
    assert not injector.skipped


def _seconds(time: tuple[int, int]) -> float:
    return time[0] + time[1] / 1e6
