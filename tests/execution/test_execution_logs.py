"""What one loss writes to the log: one WARNING, every lease record naming its execution.

An ``Executor`` with the default ``LoggingObserver`` against real Redis; the
first execution blocks the loop past its lease, the retry completes.
"""

from __future__ import annotations

import logging
import time

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from leaseworker import (
    Backoff,
    Hook,
    JobContext,
    LoggingObserver,
    RedisLeases,
    ReportJob,
    Telemetry,
)
from leaseworker._execution import Executor, decode_trigger


class _LostOnce(ReportJob):
    topic = "t"
    lease_duration = 0.5
    renewal_interval = 0.1

    def __init__(self) -> None:
        self.runs = 0

    async def run(self, ctx: JobContext) -> object:
        self.runs += 1
        if self.runs == 1:
            time.sleep(0.6)  # noqa: ASYNC251 - the point: the first execution outlives its lease
            await ctx.checkpoint()
        return None


@pytest.mark.parametrize("telemetry", [False, True])
async def test_one_loss_is_one_warning_and_the_retry_is_info_with_its_wait(
    short_timeout_leases: RedisLeases, caplog: pytest.LogCaptureFixture, telemetry: bool
) -> None:
    """The ``finished ... lost`` record warns; the lease's own records (DEBUG) name the execution.

    Before: the lease layer warned too, and with telemetry on (as under
    ``leaseworker run``) its loss and stop records added an INFO and another
    WARNING; the lease's record had no ``executionId`` or ``pod``, and the
    retry was logged at DEBUG only.
    """
    leases = short_timeout_leases  # a loss past a lease under 1 s: too short for 2 s calls
    tracer_provider, meter_provider = TracerProvider(), MeterProvider()
    hooks: list[Hook] = [LoggingObserver()]
    lease_note = None
    if telemetry:
        pod = Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider)
        spans = pod.instrument(pod="pod-a")
        hooks.append(spans)
        lease_note = spans.lease_note
    executor = Executor(
        _LostOnce(),
        leases,
        pod="pod-a",
        hooks=hooks,
        lease_note=lease_note,
        lost_retry=Backoff(initial=0.01, cap=0.02),
    )
    trigger = decode_trigger(topic="t", partition=0, offset=0, key=b"report:l", value=b"{}")
    with caplog.at_level(logging.DEBUG, logger="leaseworker"):
        ending = await executor.run(trigger, "report:l")
    assert ending.outcome == "completed"
    records = [r for r in caplog.records if r.name.startswith("leaseworker")]
    [warning] = [r for r in records if r.levelno >= logging.WARNING]
    assert (warning.__dict__["event"], warning.__dict__["outcome"]) == ("finished", "lost")
    assert "loop_blocked" in warning.getMessage()
    lost_execution = warning.__dict__["executionId"]
    for record in records:
        if record.name == "leaseworker.lease":
            assert record.__dict__["executionId"], record.getMessage()
            assert record.__dict__["pod"] == "pod-a", record.getMessage()
    lease_lost = [r for r in records if r.__dict__.get("event") == "lease_lost"]
    assert [r.levelno for r in lease_lost] == [logging.DEBUG] * (1 + telemetry)
    assert {r.__dict__["executionId"] for r in lease_lost} == {lost_execution}
    [retry] = [r for r in records if r.__dict__.get("event") == "retry"]
    assert retry.levelno == logging.INFO
    assert retry.__dict__["executionId"] == lost_execution
    assert retry.__dict__["retryInMs"] > 0
    assert "ended lost" in retry.getMessage()
    assert "starts in 0.0" in retry.getMessage()
    tracer_provider.shutdown()
    meter_provider.shutdown()
