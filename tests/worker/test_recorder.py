"""The execution recorder writes a history the fault campaign can check.

Each execution shows with its key, fence, pod, input version, Kafka offset,
outcome and the store's answer; one whose pod never ended it (killed) still
shows, open-ended, because its start line was written and flushed first.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio

from leaseworker import JobContext, RedisLeases, ReportJob, Trigger
from leaseworker._execution import Executor, decode_trigger
from leaseworker._history import History
from leaseworker._store._memory import MemoryStore
from leaseworker._worker import HistoryRecorder


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
    leases: RedisLeases, tmp_path: Path
) -> None:
    """A body that kept the loop past its deadline: ``lost`` with reason, latency and margin."""
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
