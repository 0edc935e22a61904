"""The example report job, tested as docs/testing.md shows: in memory first, then on real services.

The in-memory tests are plain functions: ``JobEnvironment.run_sync`` runs each
trigger through the pod's executor on a virtual clock, so the 30 s lease, its
10 s renewals and the 10 min ``max_runtime`` cost milliseconds, and times are
exact. The report's row and its ``reports.ready`` message commit with the
completion; the example receiver drops a redelivered or stale one. The last
test runs the same job in an embedded pod on a real Kafka and Redis (the
``leaseworker_pod`` fixture of the leaseworker pytest plugin), with the
receiver consuming what the pod's relay sent.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import anyio

from leaseworker._execution import job_key_of
from leaseworker.testing import (
    FailRenewal,
    JobEnvironment,
    LoseAtCheckpoint,
    Superseded,
    make_trigger,
)
from leaseworker_dev.pytest_plugin import PodFactory

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "report_job"


def _example(name: str = "monthly_report") -> Any:
    spec = importlib.util.spec_from_file_location(name, EXAMPLE / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


MonthlyReport = _example().MonthlyReport
receiver = _example("ready_receiver")
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
    """Another pod took the job over before this one completed: stale, final, nothing written."""
    result = JobEnvironment(MonthlyReport()).run_sync(make_trigger(REQUEST), faults=[Superseded()])
    assert (result.outcome, result.reason) == ("lost", "stale")
    assert result.completion == "stale"
    assert result.terminal
    assert result.statements == ()  # neither the report's row
    assert result.messages == ()  # nor its notification


def test_the_report_row_and_its_notification_commit_with_the_completion() -> None:
    """One transaction: the table, the row (job key, fence, rows, totals), ``reports.ready``."""
    result = JobEnvironment(MonthlyReport()).run_sync(make_trigger(REQUEST))
    [(_, create), (upsert, params)] = result.statements
    assert "INSERT INTO monthly_report" in upsert
    assert create is None
    totals = json.dumps(result.result["totals_cents"])
    assert params == ("report:acme:2026-11", result.fence, 20_000, totals)
    [message] = result.messages
    assert message.message.topic == "reports.ready"
    assert message.message.key == b"report:acme:2026-11"
    ready = {"tenant": "acme", "period": "2026-11", "fence": result.fence}
    assert json.loads(message.message.value) == ready
    assert message.fence == result.fence


def test_the_receiver_notifies_once_and_drops_a_redelivery_and_a_stale_report() -> None:
    """New inputs supersede a report; the older one's message, arriving late, is stale."""
    env = JobEnvironment(MonthlyReport())
    [older] = env.run_sync(make_trigger(REQUEST)).messages
    [newer] = env.run_sync(make_trigger({**REQUEST, "rows": 30_000}, offset=1)).messages
    assert newer.fence > older.fence
    notifier = receiver.Notifier(sqlite3.connect(":memory:", isolation_level=None))
    answers = [
        notifier.handle(row.kafka_headers(), row.message.value) for row in (newer, newer, older)
    ]
    assert answers == ["new", "duplicate", "stale"]
    notified = notifier.conn.execute("SELECT effect_id, fence FROM notification").fetchall()
    assert notified == [(newer.effect_id, newer.fence)]
    dropped = notifier.conn.execute("SELECT status, effect_id FROM dropped").fetchall()
    assert dropped == [("duplicate", newer.effect_id), ("stale", older.effect_id)]


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


async def test_the_report_runs_in_a_real_pod(leaseworker_pod: PodFactory, tmp_path: Path) -> None:
    """The same job on a real Kafka topic and Redis: completed, then a redelivery is a duplicate.

    The pod's relay sends the notification; the example receiver, on its own
    consumer group and SQLite file, records it once.
    """
    ready = f"{leaseworker_pod.topic}.ready"
    leaseworker_pod.kafka.create_topics([ready])
    job = type("Report", (MonthlyReport,), {"ready_topic": ready})
    db = str(tmp_path / "notifications.sqlite3")
    stop = anyio.Event()
    async with leaseworker_pod(job) as pod, anyio.create_task_group() as tg:
        tg.start_soon(
            lambda: receiver.receive(
                pod.config.bootstrap_servers, db, topic=ready, group=f"{ready}-r", stop=stop
            )
        )
        result = await pod.send(REQUEST)
        again = await pod.send(REQUEST)
        with anyio.fail_after(30):
            while not _notified(db):  # noqa: ASYNC110 - another connection's rows
                await anyio.sleep(0.05)
        stop.set()
    assert (result.outcome, result.completion) == ("completed", "accepted")
    assert result.result["batches"] == 10
    assert again.outcome == "duplicate"
    assert again.names == ["finished"]  # answered from the store: no lease, no run()
    assert _notified(db) == [("report:acme:2026-11", result.fence)]


def _notified(db: str) -> list[tuple[str, int]]:
    """The notifications the receiver recorded so far, by (job key, fence)."""
    if not Path(db).exists():
        return []
    with contextlib.closing(sqlite3.connect(db)) as conn:
        try:
            rows = conn.execute("SELECT job_key, fence FROM notification").fetchall()
        except sqlite3.OperationalError:  # the receiver has not made its tables yet
            return []
    return [(job_key_of(key), fence) for key, fence in rows]
