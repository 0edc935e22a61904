"""A trigger given up after its loss budget is counted, by the last loss's reason.

An ``Executor`` with the pod's telemetry as its observer, against real Redis
(no Kafka: the trace ends with the last execution), and an in-memory reader.
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from leaseworker import Backoff, JobContext, RedisLeases, ReportJob, Telemetry
from leaseworker._execution import Executor, decode_trigger


class _OutlivesItsLease(ReportJob):
    topic = "t"
    lease_duration = 0.5
    renewal_interval = 0.1
    loss_budget = 2

    async def run(self, ctx: JobContext) -> object:
        time.sleep(0.6)  # noqa: ASYNC251 - the point: a job that blocks the loop past its lease
        await ctx.checkpoint()
        return None


def _points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    assert data is not None
    return [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


async def test_a_trigger_given_up_after_its_loss_budget_is_counted(
    short_timeout_leases: RedisLeases,
) -> None:
    """Two loop_blocked losses: two losses counted, one trigger lost_repeatedly, no job key."""
    leases = short_timeout_leases  # a loss past a lease under 1 s: too short for 2 s calls
    reader = InMemoryMetricReader()
    tracer_provider, meter_provider = TracerProvider(), MeterProvider(metric_readers=[reader])
    pod = Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider).instrument(
        pod="pod-a"
    )
    executor = Executor(
        _OutlivesItsLease(),
        leases,
        pod="pod-a",
        hooks=[pod],
        lost_retry=Backoff(initial=0.01, cap=0.02),
    )
    trigger = decode_trigger(topic="t", partition=0, offset=0, key=b"report:p", value=b"{}")
    ending = await executor.run(trigger, "report:p")
    assert ending.reason == "lost_repeatedly"
    given_up = _points(reader, "leaseworker.triggers.lost_repeatedly")
    assert [(dict(p.attributes), p.value) for p in given_up] == [
        ({"leaseworker.loss.reason": "loop_blocked"}, 1)
    ]
    losses = _points(reader, "leaseworker.lease.losses")
    assert [(dict(p.attributes), p.value) for p in losses] == [
        ({"leaseworker.loss.reason": "loop_blocked"}, 2)
    ]
    data = reader.get_metrics_data()
    assert data is not None
    assert "report:p" not in data.to_json()
    tracer_provider.shutdown()
    meter_provider.shutdown()
