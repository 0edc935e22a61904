"""JobEnvironment: one trigger through the pod's executor, in memory, with faults on demand.

Every test here runs on virtual time (see conftest.py), so times are exact
and a lease of 30 s renewed every 10 s costs nothing. Each fault test states
where the job must stop and checks what it saw there.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, ClassVar

import anyio
import pytest

from leaseworker import ConfigError, JobContext, LeaseLost, MalformedTrigger, ReportJob, Trigger
from leaseworker.testing import (
    FailRenewal,
    JobEnvironment,
    KeyTaken,
    LoseAtCheckpoint,
    RenewalFault,
    Stall,
    StoreOutage,
    Superseded,
    make_trigger,
)


@dataclass
class Seen:
    """What the job saw: how many steps it finished, and what stopped it."""

    steps: int = 0
    stopped_by: list[str] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)


class Steps(ReportJob):
    """``steps`` checkpoints, then a result; optionally completes itself (``explicit``)."""

    topic = "reports"
    lease_duration = 30.0
    max_runtime: ClassVar[float | None] = 600.0

    def __init__(self) -> None:
        self.seen = Seen()

    async def run(self, ctx: JobContext) -> object:
        """Take the steps, recording what stopped them; complete or fail as the payload says."""
        try:
            for _ in range(int(ctx.trigger.payload.get("steps", 3))):
                await ctx.checkpoint()
                self.seen.steps += 1
        except BaseException as exc:
            self.seen.stopped_by.append(type(exc).__name__)
            raise
        if ctx.trigger.payload.get("explicit"):
            answer = await ctx.complete({"steps": self.seen.steps})
            self.seen.answers.append(answer.status)
        if ctx.trigger.payload.get("fail"):
            raise ValueError("bad row for customer-4711")
        return {"steps": self.seen.steps}


def _trigger(**payload: Any) -> Trigger:
    return make_trigger({"jobId": "report:acme", **payload})


async def test_a_clean_run_completes_with_its_lifecycle_in_order() -> None:
    """Acquire, start, checkpoints, release, completion, finish: all at t=0 on virtual time."""
    env = JobEnvironment(Steps())
    result = await env.run(_trigger())
    assert result.outcome == "completed"
    assert result.result == {"steps": 3}
    assert result.names == [
        "acquired",
        "started",
        "checkpoint",
        "checkpoint",
        "checkpoint",
        "released",
        "completion",
        "finished",
    ]
    assert {step.at for step in result.events} == {0.0}
    completion = await env.completion("report:acme")
    assert completion is not None
    assert completion.fence == result.fence


async def test_ctx_complete_works_inside_the_environment() -> None:
    """A job that completes itself gets the store's answer; the executor does not complete again."""
    job = Steps()
    result = await JobEnvironment(job).run(_trigger(explicit=True))
    assert job.seen.answers == ["accepted"]
    assert (result.outcome, result.completion) == ("completed", "accepted")
    assert result.names.count("completion") == 1


async def test_losing_the_lease_at_a_checkpoint_raises_lease_lost_there() -> None:
    """Lost at the 2nd checkpoint: the job saw LeaseLost there and did not finish step 2."""
    job = Steps()
    env = JobEnvironment(job)
    result = await env.run(_trigger(steps=5), faults=[LoseAtCheckpoint(2)])
    assert (result.outcome, result.reason) == ("lost", "rejected")
    assert job.seen.steps == 1
    assert job.seen.stopped_by == ["LeaseLost"]
    assert isinstance(result.error, LeaseLost)
    tail = result.names[result.names.index("lost") :]
    assert tail == ["lost", "cancel_requested", "stopped", "released", "finished", "retry"]
    assert result.of("released")[0].attrs["deleted"] is False  # the key was already gone
    assert not result.terminal
    assert result.dead_letter is None


@pytest.mark.parametrize(
    ("how", "lost_at"),
    [("rejected", 10.0), ("error", 10.0), ("timeout", 10.5), ("late", 29.651)],
)
async def test_a_failed_renewal_stops_the_job_at_its_next_await(
    how: RenewalFault, lost_at: float
) -> None:
    """The first renewal (due at 10 s) fails ``how``: the job stops at once, in its checkpoint.

    ``timeout`` takes the command timeout (0.5 s); ``late`` is processed just
    after the local deadline, 30 * 0.99 - 0.05 = 29.65 s after the acquire.
    """
    job = Steps()
    result = await JobEnvironment(job).run(
        _trigger(steps=100), faults=[FailRenewal(how)], work_per_checkpoint=1.0
    )
    assert (result.outcome, result.reason) == ("lost", how)
    assert result.at("lost") == pytest.approx(lost_at)
    assert result.at("stopped") == result.at("lost")
    assert result.of("stopped")[0].attrs["stop_latency"] == 0.0
    # Stopped in that checkpoint: cancelled inside its awaited work, or, when the verdict
    # came in the same instant the work ended, by the checkpoint's own LeaseLost.
    assert job.seen.stopped_by in (["CancelledError"], ["LeaseLost"])


async def test_the_nth_renewal_can_fail() -> None:
    """With renewals every 10 s, the 3rd one fails at 30 s after two confirmed ones."""
    result = await JobEnvironment(Steps()).run(
        _trigger(steps=100), faults=[FailRenewal("rejected", n=3)], work_per_checkpoint=1.0
    )
    assert [step.at for step in result.of("renewed")] == [10.0, 20.0]
    assert (result.reason, result.at("lost")) == ("rejected", 30.0)


async def test_a_key_taken_by_another_pod_is_seen_at_the_next_renewal() -> None:
    """Taken at 25 s, the lease is lost when the renewal at 30 s is rejected; the taker keeps it."""
    env = JobEnvironment(Steps())
    result = await env.run(
        _trigger(steps=100), faults=[KeyTaken(after=25)], work_per_checkpoint=1.0
    )
    assert result.of("fault")[0].at == 25.0
    assert (result.reason, result.at("lost")) == ("rejected", 30.0)
    holder = env.leases.holder("report:acme")
    assert holder is not None
    assert holder.startswith("another-pod:")


async def test_a_stall_past_the_deadline_loses_the_lease_at_the_next_checkpoint() -> None:
    """A 40 s blocked loop at checkpoint 2 outlives the 29.65 s deadline: lost when it wakes."""
    job = Steps()
    result = await JobEnvironment(job).run(_trigger(steps=5), faults=[Stall(2, 40.0)])
    assert result.outcome == "lost"
    assert result.reason in {"deadline", "loop_blocked"}
    assert result.at("lost") == 40.0
    assert job.seen.steps == 1
    stop_latency = result.of("stopped")[0].attrs["stop_latency"]
    assert stop_latency == pytest.approx(40.0 - 29.65)  # it ran on past the deadline


@pytest.mark.parametrize(
    ("completed", "outcome", "reason", "answer"),
    [(False, "lost", "stale", "stale"), (True, "duplicate", None, "duplicate")],
)
async def test_a_newer_fence_taking_over_refuses_this_completion(
    completed: bool, outcome: str, reason: str | None, answer: str
) -> None:
    """Before this execution completes, a newer fence claimed (or completed) the job key."""
    job = Steps()
    result = await JobEnvironment(job).run(_trigger(explicit=True), faults=[Superseded(completed)])
    assert (result.outcome, result.reason, result.completion) == (outcome, reason, answer)
    assert job.seen.answers == [answer]
    assert result.terminal  # neither is retried
    assert result.of("fault")[0].attrs["fence"] == (result.fence or 0) + 1


async def test_a_store_outage_during_completion_is_retried_while_the_lease_holds() -> None:
    """Three failed completions, then accepted: backoff time passed, the outcome is completed."""
    result = await JobEnvironment(Steps()).run(_trigger(), faults=[StoreOutage(3)])
    assert (result.outcome, result.completion) == ("completed", "accepted")
    assert result.at("finished") > 0


async def test_a_store_outage_at_the_lookup_is_retried_as_a_pod_would() -> None:
    """Without retry the run reports the non-terminal ending; with it, the trigger completes."""
    env = JobEnvironment(Steps())
    first = await env.run(_trigger(), faults=[StoreOutage(during="lookup")])
    assert (first.outcome, first.reason, first.terminal) == ("lost", "store_unavailable", False)
    assert "acquired" not in first.names  # it did not run unfenced
    again = await env.run(_trigger(), faults=[StoreOutage(during="claim")], retry=True)
    assert again.outcome == "completed"
    assert again.executions == 2
    assert "retry" in again.names


async def test_with_retry_a_lost_execution_is_followed_by_one_with_a_higher_fence() -> None:
    """The pod's retry: a second execution, a new fence, completed; faults hit the first only."""
    result = await JobEnvironment(Steps()).run(_trigger(), faults=[LoseAtCheckpoint(1)], retry=True)
    assert result.outcome == "completed"
    assert result.executions == 2
    fences = [step.attrs["fence"] for step in result.of("acquired")]
    assert fences == sorted(set(fences))
    assert result.at("acquired") < result.of("acquired")[1].at  # after the backoff


async def test_a_lease_held_by_another_pod_is_busy_and_retried() -> None:
    """Another pod holds the key: busy without running; with retry, it runs once that lease ends."""
    job = Steps()
    env = JobEnvironment(job)
    env.leases.take("report:acme", 30.0)
    busy = await env.run(_trigger())
    assert (busy.outcome, busy.terminal, job.seen.steps) == ("busy", False, 0)
    done = await env.run(_trigger(), retry=True)
    assert done.outcome == "completed"
    assert done.at("started") >= 30.0  # both runs began at 0: it waited out the 30 s TTL


async def test_a_job_that_raises_is_dead_lettered_as_failed() -> None:
    """A job's exception: failed, terminal, the pod's dead-letter reason, the error kept."""
    result = await JobEnvironment(Steps()).run(_trigger(fail=True))
    assert (result.outcome, result.dead_letter, result.terminal) == ("failed", "job_failed", True)
    assert isinstance(result.error, ValueError)


async def test_a_job_key_that_cannot_be_resolved_is_reported_not_raised() -> None:
    """job_key() refusing the trigger: no execution, the pod's dead-letter reason."""

    class Picky(Steps):
        def job_key(self, trigger: Trigger) -> str:
            raise MalformedTrigger("no_job_key", "no tenant")

    result = await JobEnvironment(Picky()).run(_trigger())
    assert (result.outcome, result.dead_letter, result.detail) == (None, "no_job_key", "no tenant")


async def test_run_record_resolves_the_job_key_once_as_a_pod_does() -> None:
    """Raw bytes: job_key() runs once for the record, and the run uses the key it gave."""

    class Counted(Steps):
        calls = 0

        def job_key(self, trigger: Trigger) -> str:
            type(self).calls += 1
            return f"report:{type(self).calls}"

    result = await JobEnvironment(Counted()).run_record(b'{"jobId": "report:acme"}')
    assert (result.outcome, result.job_key, Counted.calls) == ("completed", "report:1", 1)


async def test_a_run_that_never_ends_fails_at_the_time_limit() -> None:
    """A store down for good and no max_runtime: the run gives up after its time limit."""

    class Unbounded(Steps):
        max_runtime = None

    env = JobEnvironment(Unbounded(), time_limit=120.0)
    with pytest.raises(RuntimeError, match=r"did not reach an end within 120\.0s"):
        await env.run(_trigger(), faults=[StoreOutage(10**9)])
    assert anyio.current_time() == 120.0


async def test_a_fault_the_run_did_not_use_does_not_hit_the_next_run() -> None:
    """A renewal failure (or outage) armed in one run and not used up is forgotten after it."""
    env = JobEnvironment(Steps())
    quick = await env.run(_trigger(steps=1), faults=[FailRenewal("rejected")])
    assert quick.outcome == "completed"  # it ended before its first renewal
    down = await env.run(_trigger(again=1), faults=[StoreOutage(3, during="lookup")])
    assert down.reason == "store_unavailable"  # one lookup failed; two were never made
    later = await env.run(_trigger(steps=25, again=2), work_per_checkpoint=1.0)
    assert later.outcome == "completed"
    assert [step.at for step in later.of("renewed")] == [10.0, 20.0]


def test_a_job_class_a_pod_would_refuse_is_refused_at_construction() -> None:
    """The executor is built with the environment: bad lease settings fail there."""

    class TooShort(Steps):
        lease_duration = 0.01

    with pytest.raises(ConfigError, match="lease_duration"):
        JobEnvironment(TooShort())


async def test_one_run_at_a_time() -> None:
    """Runs share the executor's observers: a second concurrent run is refused."""

    class Announced(Steps):
        """Steps that say when the first run's job has begun."""

        def __init__(self) -> None:
            super().__init__()
            self.started = anyio.Event()

        async def run(self, ctx: JobContext) -> object:
            self.started.set()
            return await super().run(ctx)

    job = Announced()
    env = JobEnvironment(job)
    errors: list[BaseException] = []

    async def second() -> None:
        try:
            await env.run(_trigger(again=2))
        except RuntimeError as exc:
            errors.append(exc)

    async def first() -> None:
        await env.run(_trigger(steps=5), work_per_checkpoint=1.0)

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await job.started.wait()  # the first run is in progress: its job has begun
        tg.start_soon(second)
    assert [str(e) for e in errors] == ["a JobEnvironment runs one trigger at a time"]


def test_run_sync_continues_virtual_time_across_runs() -> None:
    """Plain tests use run_sync; each run starts where the previous one's clock stopped."""
    env = JobEnvironment(Steps())
    first = env.run_sync(_trigger(steps=20), work_per_checkpoint=1.0)
    assert first.at("finished") == 20.0
    second = env.run_sync(_trigger(steps=20, again=1), work_per_checkpoint=1.0)
    assert second.outcome == "completed"
    assert env.run_record_sync(b"[]").dead_letter == "not_object"


def test_the_environment_also_runs_on_a_real_loop() -> None:
    """Off virtual time the same run works, in real time (a short lease keeps it quick)."""

    class Short(Steps):
        lease_duration = 1.0

    result = asyncio.run(
        JobEnvironment(Short()).run(_trigger(steps=5), faults=[LoseAtCheckpoint(2)])
    )
    assert (result.outcome, result.reason) == ("lost", "rejected")
