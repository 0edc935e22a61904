"""The execution recorder writes a history the fault campaign can check.

Each execution shows with its key, fence, pod, input version, Kafka offset,
outcome and the store's answer; one whose pod never ended it (killed) still
shows, open-ended, because its start line was written and flushed first.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio

from leaseworker import JobContext, RedisLeases, ReportJob, Trigger
from leaseworker._events import Attempt, ExecutionEvent, LeaseEvent
from leaseworker._execution import Executor, decode_trigger
from leaseworker._store import MemoryStore
from leaseworker._worker import HistoryRecorder
from leaseworker.toolkit import History
from leaseworker_dev._campaign import Records, Stored
from leaseworker_dev._campaign._checker import one_completion


class _Completes(ReportJob):
    topic = "t"

    async def run(self, ctx: JobContext) -> object:
        return {"rows": 1}


class _Waits(ReportJob):
    topic = "t"

    def __init__(self, started: anyio.Event, release: anyio.Event) -> None:
        self.started, self.release = started, release

    async def run(self, ctx: JobContext) -> object:
        self.started.set()
        await self.release.wait()
        return None


class _BlocksTheLoop(ReportJob):
    topic = "t"
    lease_duration = 0.6
    blocked = False

    async def run(self, ctx: JobContext) -> object:
        if not self.blocked:  # once: the retry then completes
            self.blocked = True
            time.sleep(0.8)  # noqa: ASYNC251 - past the local deadline: the loss is judged when the body ends
            await ctx.checkpoint()
        return None


def _trigger(offset: int = 7) -> Trigger:
    payload = b'{"inputVersion": "v2"}'
    return decode_trigger(topic="t", partition=1, offset=offset, key=b"report:acme", value=payload)


async def test_an_ended_execution_is_recorded_with_its_identifiers(
    leases: RedisLeases, tmp_path: Path
) -> None:
    """Key, fence, pod, version, offset, outcome and the store's answer, on one clock."""
    path = tmp_path / "history.jsonl"
    job = _Completes()
    recorder = HistoryRecorder(path, input_version=job.input_version)
    executor = Executor(
        job,
        leases,
        pod="pod-a",
        hooks=[recorder],
        store=MemoryStore(),
    )
    before = time.monotonic()
    await executor.run(_trigger(), "report:acme")
    recorder.close()
    history = History.from_json(path.read_text())
    assert history.clock == "monotonic"
    (execution,) = history.executions
    assert execution.end is not None
    assert before <= execution.start <= execution.end <= time.monotonic()
    assert (execution.job_key, execution.pod, execution.input_version) == (
        "report:acme",
        "pod-a",
        "v2",
    )
    assert (execution.partition, execution.offset) == (1, 7)
    assert (execution.outcome, execution.completion) == ("completed", "accepted")
    assert execution.fence is not None
    assert [s.name for s in execution.steps] == ["acquired", "completion", "released"]
    assert float(execution.steps[-1].attrs["margin_ms"]) > 0


async def test_the_input_version_is_asked_once_per_execution(
    leases: RedisLeases, tmp_path: Path
) -> None:
    """Its start and end lines carry the attempt's version: the job is asked once (executor)."""
    asked: list[Trigger] = []

    class _Counts(_Completes):
        def input_version(self, trigger: Trigger) -> str:
            asked.append(trigger)
            return super().input_version(trigger)

    path = tmp_path / "history.jsonl"
    job = _Counts()
    recorder = HistoryRecorder(path)
    executor = Executor(job, leases, pod="pod-a", hooks=[recorder])
    await executor.run(_trigger(), "report:acme")
    recorder.close()
    assert len(asked) == 1
    (execution,) = History.from_json(path.read_text()).executions
    assert execution.input_version == job.input_version(_trigger())


async def test_an_execution_that_never_ended_shows_open_ended(
    leases: RedisLeases, tmp_path: Path
) -> None:
    """While the job runs the file already holds it (as a killed pod's file would)."""
    path = tmp_path / "history.jsonl"
    started, release = anyio.Event(), anyio.Event()
    job = _Waits(started, release)
    recorder = HistoryRecorder(path, input_version=job.input_version)
    executor = Executor(job, leases, pod="pod-a", hooks=[recorder])
    async with anyio.create_task_group() as tg:
        tg.start_soon(executor.run, _trigger(), "report:acme")
        await started.wait()
        (running,) = History.from_json(path.read_text()).executions
        assert running.end is None
        assert running.outcome is None
        release.set()
    recorder.close()
    (ended,) = History.from_json(path.read_text()).executions  # the end line replaced it
    assert ended.execution_id == running.execution_id
    assert ended.end is not None
    assert ended.outcome == "completed"


async def test_a_loss_records_its_reason_stop_latency_and_margin(
    short_timeout_leases: RedisLeases, tmp_path: Path
) -> None:
    """A body that kept the loop past its deadline: ``lost`` with reason, latency and margin."""
    leases = short_timeout_leases  # a loss past a lease under 1 s: too short for 2 s calls
    path = tmp_path / "history.jsonl"
    job = _BlocksTheLoop()
    recorder = HistoryRecorder(path, input_version=job.input_version)
    executor = Executor(job, leases, pod="pod-a", hooks=[recorder])
    with anyio.fail_after(10):
        await executor.run(_trigger(), "report:acme")
    recorder.close()
    first = History.from_json(path.read_text()).executions[0]
    assert first.outcome == "lost"
    assert first.reason in ("deadline", "loop_blocked")
    stopped = next(s for s in first.steps if s.name == "stopped")
    assert first.end == stopped.at
    assert float(stopped.attrs["latency_ms"]) > 0
    assert "margin_ms" in stopped.attrs


class _PausesAfterItsTransaction(ReportJob):
    """Commits through ``ctx.transaction()``, then blocks its loop (a pod paused before release)."""

    topic = "t"
    committed = 0.0

    async def run(self, ctx: JobContext) -> object:
        async with ctx.transaction() as tx:
            tx.publish("ready", {"n": 1})
            tx.complete({"rows": 1})
        self.committed = time.monotonic()  # the store answered before this
        time.sleep(0.05)  # noqa: ASYNC251 - the pause between commit and release, on purpose
        return {"rows": 1}


async def test_a_transactions_completion_is_placed_when_the_store_answered(
    leases: RedisLeases, tmp_path: Path
) -> None:
    """Not at the release: a pause between commit and release must not move the completion."""
    path = tmp_path / "history.jsonl"
    job = _PausesAfterItsTransaction()
    recorder = HistoryRecorder(path)
    executor = Executor(job, leases, pod="pod-a", hooks=[recorder], store=MemoryStore())
    await executor.run(_trigger(), "report:acme")
    recorder.close()
    (execution,) = History.from_json(path.read_text()).executions
    assert execution.completion == "accepted"
    steps = {s.name: s for s in execution.steps}
    completion, released = steps["completion"], steps["released"]
    assert completion.duration > 0  # the commit's own duration, not 0
    assert completion.at + completion.duration <= job.committed < released.at - 0.04


def _planted(
    recorder: HistoryRecorder, eid: str, fence: int, version: str, *, at: float
) -> Attempt:
    """Tell ``recorder`` of an execution's acquisition and start at ``at``; return its attempt."""
    trigger = _trigger(offset=fence)
    attempt = Attempt(
        trigger=trigger, job_key="report:acme", input_version=version, execution_id=eid, pod=eid
    )
    recorder(
        LeaseEvent(
            name="acquired", key="k", fence=fence, at=at, expires_at=at + 30, attempt=attempt
        )
    )
    recorder(ExecutionEvent(event="started", attempt=attempt, fence=fence))
    return attempt


def _ended(recorder: HistoryRecorder, attempt: Attempt, fence: int, **completion: Any) -> None:
    """Tell ``recorder`` of the release at ``released`` and then the store's answer (its order)."""
    released = completion.pop("released")
    recorder(LeaseEvent(name="released", key="k", fence=fence, at=released, attempt=attempt))
    recorder(ExecutionEvent(event="completion", attempt=attempt, fence=fence, **completion))
    recorder(ExecutionEvent(event="finished", attempt=attempt, outcome="completed"))


def _paused_after_commit(tmp_path: Path, *, answered_at: float | None) -> History:
    """Fence 10 commits at 1.0, its pod is paused 39 s; fence 11 (next version) completes at 32."""
    path = tmp_path / f"planted-{answered_at}.jsonl"
    recorder = HistoryRecorder(path)
    old = _planted(recorder, "a", 10, "v1", at=0.0)
    new = _planted(recorder, "b", 11, "v2", at=31.0)
    _ended(recorder, new, 11, reason="accepted", elapsed=0.01, answered_at=32.0, released=32.5)
    _ended(
        recorder, old, 10, reason="accepted", elapsed=0.01, answered_at=answered_at, released=40.0
    )
    return History.from_json(path.read_text())


def test_a_pause_between_commit_and_release_is_no_stale_accept(tmp_path: Path) -> None:
    """The checker judges fence 10's completion at its answer (1.0), before fence 11 existed.

    Stamped at its release (what an event without ``answered_at`` gets, the
    old stamp), the same history shows fence 10 accepted after fence 11's
    completion: the misjudgement a campaign with a paused pod once reported.
    """
    records = Records(
        completions={
            ("report:acme", "v1"): Stored(fence=10, execution_id="a"),
            ("report:acme", "v2"): Stored(fence=11, execution_id="b"),
        }
    )
    judged = one_completion(_paused_after_commit(tmp_path, answered_at=1.0), records)
    assert judged.passed, judged.line()
    assert judged.counts["stale_accepted"] == 0
    misjudged = one_completion(_paused_after_commit(tmp_path, answered_at=None), records)
    assert misjudged.counts["stale_accepted"] == 1
