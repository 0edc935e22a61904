"""The CPU-bound example job: its computation runs in a child process killed with the lease.

In ``JobEnvironment`` first (real children, in-memory lease and store), then
in an embedded pod on a real Kafka and Redis, whose process pool starts on the
job's first call.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from leaseworker import ProcessPool
from leaseworker.testing import FailRenewal, JobEnvironment, MemoryLeases, make_trigger
from leaseworker_dev.pytest_plugin import PodFactory

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "cpu_report"
sys.path.insert(0, str(EXAMPLE))  # as `leaseworker run` from that directory: children import it
example: Any = importlib.import_module("sales_report")
REQUEST = {"tenant": "acme", "period": "2026-11", "rows": 20_000}


class _Inline:
    """A stand-in ``ProcessContext`` for running ``crunch`` in the test's own process."""

    def checkpoint(self) -> None:
        """Never lost."""


class ShortLease(example.SalesReport):  # type: ignore[misc]
    """The example with a lease short enough to lose while a long computation runs."""

    lease_duration: ClassVar[float] = 0.6


@pytest.fixture
async def pool() -> AsyncIterator[ProcessPool]:
    """One warm worker with the example preloaded, closed after the test."""
    async with ProcessPool(1, preload=("sales_report",)) as pool:
        yield pool


async def test_the_report_is_crunched_in_a_child_and_recorded(pool: ProcessPool) -> None:
    """The child's totals are the job's result, as computed in this process; its CPU is counted."""
    result = await JobEnvironment(example.SalesReport(), processes=pool).run(make_trigger(REQUEST))
    assert (result.outcome, result.completion) == ("completed", "accepted")
    assert result.job_key == "sales:acme:2026-11"
    assert result.result["totals_cents"] == example.crunch(_Inline(), "acme", "2026-11", 20_000)
    assert result.cpu_seconds is not None
    assert result.cpu_seconds > 0


async def test_a_renewal_lost_mid_computation_kills_the_child(pool: ProcessPool) -> None:
    """Fifty million rows asked for, the first renewal rejected at 0.2 s: killed, nothing stored."""
    env = JobEnvironment(ShortLease(), leases=MemoryLeases(command_timeout=0.1), processes=pool)
    big = {**REQUEST, "rows": 50_000_000}
    result = await env.run(make_trigger(big), faults=[FailRenewal("rejected")])
    assert (result.outcome, result.reason) == ("lost", "rejected")
    assert result.completion is None
    assert await env.completion("sales:acme:2026-11") is None


async def test_the_report_runs_in_a_real_pod(leaseworker_pod: PodFactory) -> None:
    """The same job in an embedded pod on real Kafka and Redis: its pool ran the computation."""
    async with leaseworker_pod(example.SalesReport) as pod:
        result = await pod.send(REQUEST)
    assert (result.outcome, result.completion) == ("completed", "accepted")
    assert result.result["totals_cents"] == example.crunch(_Inline(), "acme", "2026-11", 20_000)
    assert result.cpu_seconds is not None
