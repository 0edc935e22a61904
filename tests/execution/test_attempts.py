"""One identity per attempt: every event of an execution carries the same ``Attempt``.

The executor makes one frozen ``Attempt`` per execution; its lease events and
execution events all carry it (trigger, job key, input version, execution id,
pod), and a retried trigger's next execution is a new attempt. The deprecated
observer shapes still receive their events through the hook adapters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

import anyio
import pytest
from redis.asyncio import Redis

from leaseworker import (
    Attempt,
    Backoff,
    Event,
    ExecutionEvent,
    JobContext,
    LeaseEvent,
    RedisLeases,
    ReportJob,
    hold,
)
from leaseworker._execution import Executor, decode_trigger


class _Completes(ReportJob):
    topic = "t"

    async def run(self, ctx: JobContext) -> object:
        await ctx.checkpoint()
        return {"rows": 1}


class _LosesOnce(ReportJob):
    """The first execution's lease key is deleted under it: its renewal is rejected."""

    topic = "t"
    lease_duration = 3.0
    renewal_interval = 0.2

    def __init__(self, delete: Callable[[], Awaitable[object]]) -> None:
        self._delete = delete
        self._lost = False

    async def run(self, ctx: JobContext) -> object:
        if not self._lost:
            self._lost = True
            await self._delete()
            await anyio.sleep_forever()  # cancelled at the rejected renewal
        return {"rows": 1}


def _attempts(events: list[Event]) -> list[Attempt | None]:
    return [event.attempt for event in events if isinstance(event, ExecutionEvent | LeaseEvent)]


async def test_every_event_of_an_execution_carries_its_one_attempt(leases: RedisLeases) -> None:
    """acquiring, acquired, started, released, finished: one Attempt object, the trigger's."""
    events: list[Event] = []
    executor = Executor(_Completes(), leases, pod="pod-a", hooks=[events.append])
    trigger = decode_trigger(topic="t", partition=0, offset=5, key=b"report:a", value=b"{}")
    ending = await executor.run(trigger, "report:a")
    assert ending.outcome == "completed"
    (attempt,) = set(map(id, _attempts(events)))
    first = _attempts(events)[0]
    assert first is not None
    assert id(first) == attempt
    assert (first.trigger, first.job_key, first.pod) == (trigger, "report:a", "pod-a")
    assert first.input_version == _Completes().input_version(trigger)
    names = [e.event if isinstance(e, ExecutionEvent) else e.name for e in events]
    assert names[:3] == ["acquiring", "acquired", "started"]
    assert names[-2:] == ["released", "finished"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.job_key = "other"  # type: ignore[misc]


async def test_a_retried_trigger_runs_a_new_attempt_with_the_same_identity(
    leases: RedisLeases, redis: Redis
) -> None:
    """A loss, then a retry: two attempts, two execution ids, one job key and input version."""
    events: list[Event] = []
    executor = Executor(
        _LosesOnce(lambda: redis.delete(leases.lease_key("report:r"))),
        leases,
        pod="pod-a",
        hooks=[events.append],
        lost_retry=Backoff(initial=0.01, cap=0.02),
    )
    trigger = decode_trigger(topic="t", partition=0, offset=6, key=b"report:r", value=b"{}")
    assert (await executor.run(trigger, "report:r")).outcome == "completed"
    finished = [e for e in events if isinstance(e, ExecutionEvent) and e.event == "finished"]
    assert [(e.outcome, e.reason) for e in finished] == [("lost", "rejected"), ("completed", None)]
    first, second = (e.attempt for e in finished)
    assert first.execution_id != second.execution_id
    assert (first.job_key, first.input_version) == (second.job_key, second.input_version)


async def test_a_deprecated_lease_observer_still_gets_the_lease_events(
    leases: RedisLeases,
) -> None:
    """``hold(observer=)`` with an ``on_lease_event`` object: adapted to a hook, same events."""
    seen: list[str] = []

    class _Old:
        def on_lease_event(self, event: LeaseEvent) -> None:
            seen.append(event.name)

    async with hold(leases, "k", lease_duration=4.0, observer=_Old()):
        pass
    assert seen == ["acquired", "released"]


async def test_a_hook_that_raises_is_logged_and_skipped(
    leases: RedisLeases, caplog: pytest.LogCaptureFixture
) -> None:
    """A broken hook before a good one: the good one still hears every event, the run completes."""
    good: list[Event] = []

    def broken(event: Event) -> None:
        raise RuntimeError("hook bug")

    executor = Executor(
        _Completes(),
        leases,
        pod="pod-a",
        hooks=[broken, good.append],
        lost_retry=Backoff(initial=0.01, cap=0.02),
    )
    trigger = decode_trigger(topic="t", partition=0, offset=0, key=b"report:b", value=b"{}")
    assert (await executor.run(trigger, "report:b")).outcome == "completed"
    assert len(good) >= 5
    assert len([r for r in caplog.records if r.getMessage().startswith("hook ")]) == len(good)


async def test_a_hook_that_accepts_execution_events_gets_no_lease_event(
    leases: RedisLeases,
) -> None:
    """``accepts`` is read once: such a hook hears the executor's steps, not the lease's."""

    class _ExecutionsOnly:
        accepts = (ExecutionEvent,)

        def __init__(self) -> None:
            self.kinds: set[type] = set()

        def __call__(self, event: Event) -> None:
            self.kinds.add(type(event))

    only = _ExecutionsOnly()
    executor = Executor(_Completes(), leases, pod="pod-a", hooks=[only])
    trigger = decode_trigger(topic="t", partition=0, offset=0, key=b"report:c", value=b"{}")
    assert (await executor.run(trigger, "report:c")).outcome == "completed"
    assert only.kinds == {ExecutionEvent}
