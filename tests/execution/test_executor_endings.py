"""The executor's ending carries the outcome, whether it ends the trigger, and a failure's type.

The dead letter of a failed or timed-out trigger names the exception's class;
it comes from the ending itself, so no observer has to listen for it.
"""

from __future__ import annotations

import anyio
import pytest

from leaseworker import (
    Backoff,
    Event,
    ExecutionEvent,
    JobContext,
    RedisLeases,
    ReportJob,
    StoreUnavailable,
    Trigger,
)
from leaseworker._execution import Ending, Executor, decode_trigger


class _Events:
    """An execution observer that keeps every event."""

    def __init__(self) -> None:
        self.events: list[ExecutionEvent] = []

    def __call__(self, event: Event) -> None:
        if not isinstance(event, ExecutionEvent) or event.event == "acquiring":
            return
        self.events.append(event)


class _Raises(ReportJob):
    topic = "t"

    async def run(self, ctx: JobContext) -> object:
        raise ValueError("bad row for customer-4711")  # its message must not travel


class _Overruns(ReportJob):
    topic = "t"
    max_runtime = 0.05

    async def run(self, ctx: JobContext) -> object:
        await anyio.sleep_forever()
        return None  # never reached: max_runtime cancels the sleep


class _Completes(ReportJob):
    topic = "t"

    async def run(self, ctx: JobContext) -> object:
        return {"rows": 1}


class _BadVersion(_Completes):
    def input_version(self, trigger: Trigger) -> str:
        return 42  # type: ignore[return-value]  # the job's bug under test


class _VersionRaises(_Completes):
    def input_version(self, trigger: Trigger) -> str:
        return str(trigger.payload["snapshot"])  # KeyError: the job's own bug


def _trigger() -> Trigger:
    return decode_trigger(topic="t", partition=0, offset=3, key=b"report:acme", value=b"{}")


async def _run(job: ReportJob, leases: RedisLeases) -> tuple[Ending, list[ExecutionEvent]]:
    events = _Events()
    executor = Executor(job, leases, pod="pod-a", hooks=[events])
    ending = await executor.run(_trigger(), "report:acme")
    return ending, events.events


@pytest.mark.parametrize(
    ("job", "outcome", "error_type"),
    [
        (_Raises(), "failed", "ValueError"),
        (_Overruns(), "timed_out", "LeaseTimeout"),
        (_VersionRaises(), "failed", "KeyError"),
    ],
)
async def test_a_failure_ends_the_trigger_and_names_its_exception_type(
    leases: RedisLeases, job: ReportJob, outcome: str, error_type: str
) -> None:
    """Failed and timed-out endings are terminal and carry the class name, never the message."""
    ending, events = await _run(job, leases)
    assert ending == Ending(outcome, error_type=error_type)  # type: ignore[arg-type]
    assert ending.terminal
    finished = [e for e in events if e.event == "finished"]
    assert [type(e.error).__name__ for e in finished] == [error_type]


async def test_a_completed_ending_carries_no_error_type(leases: RedisLeases) -> None:
    """Only a failure names an exception: a completed trigger is just completed."""
    ending, _ = await _run(_Completes(), leases)
    assert ending == Ending("completed")
    assert ending.terminal


@pytest.mark.fake
def test_an_endings_terminal_flag_follows_the_one_definition() -> None:
    """``Ending.terminal`` is derived, so it cannot disagree with ``ends_trigger``."""
    assert Ending("duplicate").terminal
    assert Ending("lost", reason="stale").terminal
    assert not Ending("lost", reason="store_unavailable").terminal
    assert not Ending("busy").terminal
    assert not Ending("cancelled").terminal


@pytest.mark.fake
def test_only_a_failure_keeps_the_type_of_the_error_that_ended_it() -> None:
    """A loss or a cancellation is not dead-lettered, so it names no exception type."""
    assert Ending.of_error("failed", KeyError("x")).error_type == "KeyError"
    assert Ending.of_error("timed_out", TimeoutError()).error_type == "TimeoutError"
    assert Ending.of_error("lost", RuntimeError()).error_type is None
    assert Ending.of_error("cancelled", RuntimeError()).error_type is None


async def test_an_input_version_no_store_keeps_is_refused_as_bad_input_version(
    leases: RedisLeases,
) -> None:
    """A NUL in ``inputVersion`` or a non-str version: its own reason, not "the job raised"."""
    events = _Events()
    executor = Executor(_Completes(), leases, pod="pod-a", hooks=[events])
    nul = decode_trigger(
        topic="t", partition=0, offset=1, key=b"k", value=b'{"inputVersion": "v\\u0000"}'
    )
    for job, trigger, said in ((_Completes(), nul, "NUL"), (_BadVersion(), _trigger(), "int")):
        executor = Executor(job, leases, pod="pod-a", hooks=[events])
        ending = await executor.run(trigger, "k")
        assert (ending.outcome, ending.reason, ending.error_type) == (
            "failed",
            "bad_input_version",
            None,
        )
        assert ending.terminal
        assert ending.dead_letter == "bad_input_version"
        assert ending.detail is not None
        assert said in ending.detail
    assert [e.reason for e in events.events] == ["bad_input_version"] * 2


@pytest.mark.fake
def test_an_endings_dead_letter_reason_follows_its_outcome_and_reason() -> None:
    """Failures are job_<outcome>; refusals are their own reason; the rest are not dead-lettered."""
    assert Ending("failed").dead_letter == "job_failed"
    assert Ending("timed_out").dead_letter == "job_timed_out"
    assert Ending("failed", reason="bad_result").dead_letter == "bad_result"
    assert Ending("lost", reason="lost_repeatedly").dead_letter == "lost_repeatedly"
    assert Ending("lost").dead_letter is None
    assert Ending("lost", reason="stale").dead_letter is None
    assert Ending("completed").dead_letter is None


class _StoreFailsInside(ReportJob):
    """Its block's store call fails ``failures`` times (a connection the server ended)."""

    topic = "t"

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.runs = 0

    async def run(self, ctx: JobContext) -> object:
        self.runs += 1
        if self.runs <= self.failures:
            raise StoreUnavailable(ctx.job_key, "injected: the server ended the connection")
        return {"rows": 1}


async def test_a_store_that_fails_inside_the_block_does_not_end_the_trigger(
    leases: RedisLeases,
) -> None:
    """The store, not the job, failed: the execution is ``lost`` and the trigger runs again."""
    job, events = _StoreFailsInside(failures=1), _Events()
    executor = Executor(job, leases, pod="pod-a", hooks=[events], lost_retry=Backoff(initial=0.01))
    ending = await executor.run(_trigger(), "report:acme")
    assert ending == Ending("completed")
    assert job.runs == 2
    finished = [(e.outcome, e.reason) for e in events.events if e.event == "finished"]
    assert finished == [("lost", "store_unavailable"), ("completed", None)]


async def test_a_store_that_fails_inside_every_block_spends_the_loss_budget(
    leases: RedisLeases,
) -> None:
    """Each such loss counts: the budget spent, the trigger is dead-lettered, never looped."""
    job = _StoreFailsInside(failures=10)
    executor = Executor(job, leases, pod="pod-a", loss_budget=2, lost_retry=Backoff(initial=0.01))
    ending = await executor.run(_trigger(), "report:acme")
    assert (ending.outcome, ending.reason, ending.error_type) == (
        "lost",
        "lost_repeatedly",
        "StoreUnavailable",
    )
    assert ending.terminal
    assert ending.dead_letter == "lost_repeatedly"
    assert job.runs == 2
