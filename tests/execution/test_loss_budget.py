"""The loss budget: a trigger whose executions lose their lease every time is given up.

Each loss is retried with the lost backoff; once ``loss_budget`` losses came in
a row the trigger ends ``lost`` with reason ``lost_repeatedly`` (terminal, and
dead-lettered by the source). Losses of a lease never held (Redis did not
answer the acquire) do not count: Redis being away is retried as long as it takes.
"""

from __future__ import annotations

import time

import anyio
import pytest

from leaseworker import (
    Backoff,
    Event,
    ExecutionEvent,
    JobContext,
    Lease,
    LeaseInfo,
    LeaseUnavailable,
    RedisLeases,
    ReportJob,
    Trigger,
)
from leaseworker._execution import Ending, Executor, decode_trigger
from leaseworker._lease import DeadlinePolicy

QUICK = Backoff(initial=0.01, cap=0.02)
"""The lost backoff in these tests: the retries are real, their waits short."""


class _Events:
    """An execution observer that keeps every event."""

    def __init__(self) -> None:
        self.events: list[ExecutionEvent] = []

    def __call__(self, event: Event) -> None:
        if not isinstance(event, ExecutionEvent) or event.event == "acquiring":
            return
        self.events.append(event)

    def named(self, name: str) -> list[ExecutionEvent]:
        return [event for event in self.events if event.event == name]


class _OutlivesItsLease(ReportJob):
    """Blocks the event loop past its lease on every attempt (a poison trigger)."""

    topic = "t"
    lease_duration = 0.5
    renewal_interval = 0.1
    loss_budget = 3

    async def run(self, ctx: JobContext) -> object:
        time.sleep(0.6)  # noqa: ASYNC251 - the point: a job that blocks the loop past its lease
        await ctx.checkpoint()
        return None


class _Completes(ReportJob):
    topic = "t"
    loss_budget = 1

    async def run(self, ctx: JobContext) -> object:
        return None


def _trigger() -> Trigger:
    return decode_trigger(topic="t", partition=0, offset=7, key=b"report:p", value=b"{}")


async def _run(executor: Executor) -> Ending:
    with anyio.fail_after(30):
        return await executor.run(_trigger(), "report:p")


async def test_a_job_lost_on_every_attempt_is_given_up_after_its_loss_budget(
    short_timeout_leases: RedisLeases,
) -> None:
    """Three losses (the class's budget), two retries between them, then lost_repeatedly."""
    leases = short_timeout_leases  # a loss past a lease under 1 s: too short for 2 s calls
    events = _Events()
    executor = Executor(_OutlivesItsLease(), leases, pod="pod-a", hooks=[events], lost_retry=QUICK)
    ending = await _run(executor)
    assert (ending.outcome, ending.reason, ending.loss_reason) == (
        "lost",
        "lost_repeatedly",
        "loop_blocked",
    )
    assert ending.terminal
    assert ending.dead_letter == "lost_repeatedly"
    assert ending.detail is not None
    assert "3 executions in a row" in ending.detail
    assert "loop_blocked" in ending.detail
    finished = events.named("finished")
    assert [e.outcome for e in finished] == ["lost"] * 3
    assert [e.reason for e in finished] == ["loop_blocked", "loop_blocked", "lost_repeatedly"]
    assert finished[-1].terminal  # telemetry closes the trigger's trace on it
    assert len(events.named("retry")) == 2


async def test_the_pods_loss_budget_overrides_the_class_attribute(
    short_timeout_leases: RedisLeases,
) -> None:
    """``Executor(loss_budget=1)`` (from ``--loss-budget``) gives up after the first loss."""
    leases = short_timeout_leases  # a loss past a lease under 1 s: too short for 2 s calls
    events = _Events()
    executor = Executor(
        _OutlivesItsLease(), leases, pod="pod-a", hooks=[events], lost_retry=QUICK, loss_budget=1
    )
    ending = await _run(executor)
    assert ending.reason == "lost_repeatedly"
    assert len(events.named("finished")) == 1
    assert not events.named("retry")


class _UnansweredAcquires:
    """A real RedisLeases whose first ``failures`` acquires get no answer (a Redis outage)."""

    def __init__(self, inner: RedisLeases, failures: int) -> None:
        self.inner = inner
        self.failures = failures

    @property
    def policy(self) -> DeadlinePolicy:
        return self.inner.policy

    async def acquire(self, key: str, lease_duration: float, *, note: str = "") -> Lease | None:
        if self.failures > 0:
            self.failures -= 1
            raise LeaseUnavailable(key, "injected: no answer")
        return await self.inner.acquire(key, lease_duration)

    async def renew(self, lease: Lease) -> Lease:
        return await self.inner.renew(lease)

    async def release(self, lease: Lease) -> bool:
        return await self.inner.release(lease)

    async def inspect(self, key: str) -> LeaseInfo:
        return await self.inner.inspect(key)


@pytest.mark.fake  # acquires that get no answer, around real Redis
async def test_acquires_redis_did_not_answer_do_not_spend_the_loss_budget(
    leases: RedisLeases,
) -> None:
    """Redis away is retried as long as it takes: with a budget of 1, the job still completes."""
    events = _Events()
    executor = Executor(
        _Completes(), _UnansweredAcquires(leases, 3), pod="pod-a", hooks=[events], lost_retry=QUICK
    )
    ending = await _run(executor)
    assert ending == Ending("completed")
    assert [e.outcome for e in events.named("finished")] == ["lost"] * 3 + ["completed"]
