"""The example report job, tested as docs/testing.md shows: in memory first, then on real services.

The in-memory tests are plain functions: ``JobEnvironment.run_sync`` runs each
trigger through the pod's executor on a virtual clock, so the 30 s lease, its
10 s renewals and the 10 min ``max_runtime`` cost milliseconds, and times are
exact. The last test runs the same job in an embedded pod on a real Kafka and
Redis (the ``leaseworker_pod`` fixture of the leaseworker pytest plugin).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from leaseworker.testing import (
    FailRenewal,
    JobEnvironment,
    LoseAtCheckpoint,
    Superseded,
    make_trigger,
)
from leaseworker.testing.pytest_plugin import PodFactory

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "report_job" / "monthly_report.py"


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("monthly_report", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


MonthlyReport = _example().MonthlyReport
REQUEST = {"tenant": "acme", "period": "2026-11", "rows": 20_000}  # 10 batches of 2,000


def test_a_report_completes_with_every_batch_and_its_fence() -> None:
    """The happy path: completed, every batch counted, the result recorded with its fence."""
    result = JobEnvironment(MonthlyReport()).run_sync(make_trigger(REQUEST))
    assert result.outcome == "completed"
    assert result.job_key == "report:acme:2026-11"
    assert result.result["batches"] == 10
    assert result.result["fence"] == result.fence
    assert result.completion == "accepted"
    assert result.checkpoints == 10


def test_a_lost_lease_stops_the_report_at_the_next_checkpoint() -> None:
    """Ownership gone at the 3rd batch: the job stops there, with nothing reported."""
    result = JobEnvironment(MonthlyReport()).run_sync(
        make_trigger(REQUEST), faults=[LoseAtCheckpoint(3)]
    )
    assert (result.outcome, result.reason) == ("lost", "rejected")
    assert result.checkpoints == 3  # not 10: it did not run on to the end
    assert result.completion is None  # nothing was written
    assert not result.terminal  # a pod would retry the trigger


def test_a_failed_renewal_stops_the_report_at_its_next_await() -> None:
    """A renewal that gets no answer at 10 s: the job stops at 10.5 s (the command timeout)."""
    result = JobEnvironment(MonthlyReport()).run_sync(
        make_trigger(REQUEST), faults=[FailRenewal("timeout")], work_per_checkpoint=5.0
    )
    assert (result.outcome, result.reason) == ("lost", "timeout")
    assert result.at("lost") == 10.5
    assert result.checkpoints == 3  # batches at 0, 5 and 10 s; stopped inside the third


def test_a_redelivered_request_is_a_duplicate_and_new_inputs_a_new_report() -> None:
    """Same trigger twice: answered from the store without running; new rows: a new report."""
    env = JobEnvironment(MonthlyReport())
    first = env.run_sync(make_trigger(REQUEST))
    again = env.run_sync(make_trigger(REQUEST, offset=1))
    assert again.outcome == "duplicate"
    assert "started" not in again.names  # no lease taken, run() never called
    changed = env.run_sync(make_trigger({**REQUEST, "rows": 30_000}, offset=2))
    assert changed.outcome == "completed"
    assert changed.fence is not None
    assert first.fence is not None
    assert changed.fence > first.fence


def test_a_report_superseded_by_a_newer_fence_is_refused_as_stale() -> None:
    """Another pod took the job over before this one completed: stale, final, not retried."""
    result = JobEnvironment(MonthlyReport()).run_sync(make_trigger(REQUEST), faults=[Superseded()])
    assert (result.outcome, result.reason) == ("lost", "stale")
    assert result.completion == "stale"
    assert result.terminal


def test_a_report_outliving_max_runtime_times_out_at_exactly_ten_minutes() -> None:
    """A minute per batch: the 10-minute bound stops it at 600 s while renewals keep succeeding."""
    big = {**REQUEST, "rows": 1_000_000}
    result = JobEnvironment(MonthlyReport()).run_sync(make_trigger(big), work_per_checkpoint=60.0)
    assert result.outcome == "timed_out"
    assert result.dead_letter == "job_timed_out"
    assert result.at("finished") == 600.0
    assert [step.at for step in result.of("renewed")][:3] == [10.0, 20.0, 30.0]


def test_a_request_without_tenant_and_period_is_dead_lettered() -> None:
    """Malformed input never reaches run(): the pod's dead-letter reason says why."""
    env = JobEnvironment(MonthlyReport())
    assert env.run_record_sync(b'{"tenant": "acme"}').dead_letter == "no_job_key"
    assert env.run_record_sync(b"not json").dead_letter == "not_json"


async def test_the_report_runs_in_a_real_pod(leaseworker_pod: PodFactory) -> None:
    """The same job on a real Kafka topic and Redis: completed, then a redelivery is a duplicate."""
    async with leaseworker_pod(MonthlyReport) as pod:
        result = await pod.send(REQUEST)
        again = await pod.send(REQUEST)
    assert (result.outcome, result.completion) == ("completed", "accepted")
    assert result.result["batches"] == 10
    assert again.outcome == "duplicate"
    assert again.names == ["finished"]  # answered from the store: no lease, no run()
