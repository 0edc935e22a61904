"""The example report job runs under a real lease and stops at a checkpoint after a loss."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from leaseworker import JobContext, LeaseLost, MalformedTrigger, RedisLeases, hold
from leaseworker._execution._trigger import decode_trigger

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "report_job" / "monthly_report.py"


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("monthly_report", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _trigger(payload: bytes) -> Any:
    return decode_trigger(topic="reports.requested", partition=0, offset=0, key=None, value=payload)


async def test_the_report_totals_every_row_in_batches(leases: RedisLeases) -> None:
    """All rows are counted, in ceil(rows / batch) batches, and the result carries the fence."""
    job = _example().MonthlyReport()
    trigger = _trigger(b'{"tenant": "acme", "period": "2026-11", "rows": 5000}')
    key = job.job_key(trigger)
    assert key == "report:acme:2026-11"
    async with hold(leases, key, ttl=2) as held:
        ctx = JobContext(held=held, job_key=key, execution_id="e1", pod="p", trigger=trigger)
        result = await job.run(ctx)
    assert result["batches"] == 3
    assert result["fence"] == held.fence
    assert sum(result["totals_cents"].values()) > 0


async def test_a_lost_lease_stops_the_report_at_the_next_batch(
    leases: RedisLeases, redis: Redis
) -> None:
    """Deleting the lease mid-report: the job stops with LeaseLost instead of finishing."""
    job = _example().MonthlyReport()
    trigger = _trigger(b'{"tenant": "acme", "period": "2026-12", "rows": 1000000}')
    key = job.job_key(trigger)
    finished = False
    with pytest.raises(LeaseLost) as lost:
        async with hold(leases, key, ttl=1.2, renew_every=0.3) as held:
            await redis.delete(leases.lease_key(key))
            ctx = JobContext(held=held, job_key=key, execution_id="e1", pod="p", trigger=trigger)
            await job.run(ctx)
            finished = True  # a job that ignored the loss would get here (and only then fail)
    assert not finished
    assert held.outcome == "lost"
    assert lost.value.stop_latency is not None
    assert lost.value.stop_latency < 1.2  # within the TTL: at a checkpoint, not at the end


def test_a_request_without_tenant_and_period_is_malformed() -> None:
    """The job key override turns an incomplete request into a dead letter, not a crash."""
    with pytest.raises(MalformedTrigger):
        _example().MonthlyReport().job_key(_trigger(b'{"tenant": "acme"}'))
