"""Many holds on one RedisLeases: renewals share trips, ends share releases (real Redis)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import anyio
import anyio.abc
import pytest
from redis.asyncio import Redis

from leaseworker import (
    Event,
    HeldLease,
    Lease,
    LeaseEvent,
    LeaseLost,
    LeaseUnavailable,
    RedisLeases,
    hold,
)
from leaseworker._lease._releases import BATCH, ReleaseMany, releases
from leaseworker.testing import run_in_virtual_time
from leaseworker_dev._services import LocalRedis

from ..chaos import proxied_leases

BURST = 10_000
"""Holds that end in one loop turn, as many as the bench holds."""
LONG = 180.0
"""The burst's lease: first renewed after 60 s, when starting the holds has failed already.

The burst is about the releases; a renewal of the first holds while the last ones
still acquire (20 s and more with the suite's workers on two cores) could only time out.
"""


class _Renewals:
    """A hook counting confirmed renewals per key; ``enough`` is set once every key has ``n``."""

    def __init__(self, keys: int, n: int) -> None:
        self.counts: dict[str, int] = {}
        self.enough = anyio.Event()
        self._keys = keys
        self._n = n

    def __call__(self, event: Event) -> None:
        assert isinstance(event, LeaseEvent)
        if event.name == "renewed":
            self.counts[event.key] = self.counts.get(event.key, 0) + 1
            if sum(count >= self._n for count in self.counts.values()) >= self._keys:
                self.enough.set()


async def _start(
    tg: anyio.abc.TaskGroup,
    count: int,
    holder: Callable[[int, anyio.Event], Coroutine[Any, Any, None]],
    *,
    step: int = 100,
) -> None:
    """Start ``count`` holders in ``tg``, ``step`` at a time; return once all are inside."""
    for first in range(0, count, step):
        inside = [anyio.Event() for _ in range(first, min(first + step, count))]
        for i, entered in enumerate(inside, start=first):
            tg.start_soon(holder, i, entered)
        for entered in inside:
            await entered.wait()


async def _end_together(leases: RedisLeases, prefix: str, count: int) -> list[HeldLease]:
    """Hold ``count`` leases, end every body in one loop turn, close ``leases``; the holds."""
    end = anyio.Event()
    held: list[HeldLease] = []

    async def holder(i: int, entered: anyio.Event) -> None:
        async with hold(leases, f"{prefix}:{i}", lease_duration=30) as lease:
            held.append(lease)
            entered.set()
            await end.wait()

    try:
        async with anyio.create_task_group() as tg:
            # Ten acquires at a time, each given 2 s (the leases fixture's): fifty at once, or
            # ten with a pod's 0.5 s, overran their calls beside a CPU hog; the releases, this
            # helper's subject, still all go in one loop turn.
            await _start(tg, count, holder, step=10)
            end.set()
    finally:
        await leases.aclose()
    return held


@pytest.mark.timeout(120)
async def test_ten_thousand_holds_ending_at_once_all_release(redis: Redis, namespace: str) -> None:
    """Every body ends in one loop turn: each release answers, none fails, no key is left."""
    leases = RedisLeases(redis, namespace=namespace)  # a pod's command timeout
    end = anyio.Event()
    held: list[HeldLease] = []
    missed: set[bytes] = set()  # acquires that timed out (under coverage on a loaded machine)

    async def holder(i: int, entered: anyio.Event) -> None:
        for attempt in range(3):  # the burst is what is tried here, not the acquires
            key = f"burst:{i}:{attempt}"
            try:
                async with hold(leases, key, lease_duration=LONG) as lease:
                    held.append(lease)
                    entered.set()
                    await end.wait()
            except LeaseUnavailable:
                missed.add(leases.lease_key(key).encode())  # may have landed: it expires
            else:
                return
        raise AssertionError(f"three acquires of burst:{i} timed out")

    try:
        async with anyio.create_task_group() as tg:
            with anyio.fail_after(60):
                await _start(tg, BURST, holder)
            end.set()  # every holder wakes in the next loop turn, and ends there
    finally:
        await leases.aclose()
    assert [h.outcome for h in held] == ["completed"] * BURST
    assert [h.release_error for h in held if h.release_error is not None] == []
    # a failure names each: its key, the release's answer, its renewals, the worst loop lag
    unreleased = [
        (h.key, h.released, h.renewals, round(h.max_loop_lag, 3))
        for h in held
        if h.released is not True
    ]
    assert unreleased == []
    assert set(await redis.keys(f"{namespace}:*:lease")) <= missed


async def test_releases_failed_in_a_trip_go_once_more(
    leases: RedisLeases, redis: Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch trip fails (a busy loop read it late): its releases go again and each answers."""
    trips: list[int] = []
    release_many = leases.release_many

    async def first_trip_late(batch: Sequence[Lease]) -> list[bool | LeaseUnavailable]:
        trips.append(len(batch))
        if len(trips) == 1:
            return [LeaseUnavailable(lease.key, "timed out") for lease in batch]
        return await release_many(batch)

    monkeypatch.setattr(leases, "release_many", first_trip_late)
    held = await _end_together(leases, "late", 50)
    assert trips == [50, 50]  # the batch, then its failed releases together
    assert [h.release_error for h in held if h.release_error is not None] == []
    assert all(h.released is True for h in held)
    assert await redis.keys(f"{namespace}:*:lease") == []


async def test_a_release_whose_first_trip_deleted_unanswered_still_answers_true(
    leases: RedisLeases, redis: Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first trip deletes the keys but its answers are lost: the retry finds them gone."""
    trips: list[list[bool | LeaseUnavailable]] = []
    release_many = leases.release_many

    async def first_answers_lost(batch: Sequence[Lease]) -> list[bool | LeaseUnavailable]:
        answers = await release_many(batch)
        trips.append(answers)
        if len(trips) == 1:  # ran in Redis; its reply read too late
            return [LeaseUnavailable(lease.key, "timed out") for lease in batch]
        return answers

    monkeypatch.setattr(leases, "release_many", first_answers_lost)
    held = await _end_together(leases, "lost", 20)
    assert trips == [[True] * 20, [False] * 20]  # the retry found every key already gone
    assert [h.release_error for h in held if h.release_error is not None] == []
    assert [h.released for h in held] == [True] * 20
    assert await redis.keys(f"{namespace}:*:lease") == []


async def test_a_retried_release_past_its_deadline_answers_what_redis_said() -> None:
    """Past its local deadline a lease may have expired: the retry's ``False`` stands."""
    late = Lease(key="k", owner="o", fence=1, lease_duration=1, sent_at=0, local_deadline=0)
    trips = 0

    async def many(batch: Sequence[Lease]) -> list[bool | BaseException]:
        nonlocal trips
        trips += 1
        return [TimeoutError("timed out") if trips == 1 else False for _ in batch]

    answer = releases().release(many, late, 1.0)
    assert await answer is False
    assert trips == 2


def _serial_store(trip: float) -> tuple[list[float], ReleaseMany]:
    """A ``release_many`` whose trips go one at a time on one connection, ``trip`` s each."""
    answered: list[float] = []
    connection = asyncio.Lock()

    async def many(batch: Sequence[Lease]) -> list[bool | BaseException]:
        async with connection:
            await asyncio.sleep(trip)
            answered.append(asyncio.get_running_loop().time())
            return [True] * len(batch)

    return answered, many


def _release_at_once(many: ReleaseMany, count: int) -> list[bool | BaseException]:
    """Release ``count`` leases in one loop turn (1 s timeout) on virtual time; the answers."""
    lease = Lease(key="k", owner="o", fence=1, lease_duration=30, sent_at=0, local_deadline=29)

    async def scenario() -> list[bool | BaseException]:
        answers = [releases().release(many, lease, 1.0) for _ in range(count)]
        return await asyncio.gather(*answers, return_exceptions=True)

    return run_in_virtual_time(scenario())


def test_batches_queued_behind_each_other_are_not_timed_out_for_the_wait() -> None:
    """Three batches on a store that takes its trips one at a time: each may wait for those ahead.

    Each trip takes 1.5 s, inside a batch's own bound (``BATCH_BOUND`` x 1 s); the third
    is answered 4.5 s after the turn, which a bound from the turn's end would have failed.
    """
    answered, many = _serial_store(1.5)
    assert _release_at_once(many, 2 * BATCH + 1) == [True] * (2 * BATCH + 1)
    assert answered == [1.5, 3.0, 4.5]  # three trips, one each: none failed and went again


def test_a_batch_that_never_answers_fails_at_its_bound_after_those_ahead() -> None:
    """A store that never answers: the n-th batch fails n bounds after the turn, then once more."""
    failed_at: list[float] = []

    async def never(batch: Sequence[Lease]) -> list[bool | BaseException]:
        try:
            await asyncio.Event().wait()
        finally:
            failed_at.append(asyncio.get_running_loop().time())
        raise AssertionError("unreachable")

    answers = _release_at_once(never, BATCH + 1)
    assert {type(answer) for answer in answers} == {TimeoutError}
    # batch 1: 2 s, again 2 s; batch 2: 4 s, again 4 s (each try bounded by n x 2 s)
    assert failed_at == [2.0, 4.0, 4.0, 8.0]


async def test_a_rejected_renewal_in_a_shared_trip_stops_only_its_own_body(
    leases: RedisLeases, redis: Redis
) -> None:
    """Twenty leases renewed together; one key deleted: that body alone is cancelled."""
    renewals = _Renewals(keys=19, n=2)
    lost = anyio.Event()
    end = anyio.Event()
    held: dict[int, HeldLease] = {}
    errors: dict[int, LeaseLost] = {}

    async def holder(i: int, entered: anyio.Event) -> None:
        try:
            async with hold(
                leases, f"k{i}", lease_duration=3, renewal_interval=0.2, hooks=[renewals]
            ) as lease:
                held[i] = lease
                entered.set()
                await end.wait()
        except LeaseLost as exc:
            errors[i] = exc
            lost.set()

    async with anyio.create_task_group() as tg:
        with anyio.fail_after(10):
            await _start(tg, 20, holder, step=20)
            await redis.delete(leases.lease_key("k0"))  # before its first renewal (0.2 s)
            await lost.wait()
            await renewals.enough.wait()  # the other nineteen renewed twice meanwhile
        end.set()
    assert list(errors) == [0]
    assert errors[0].reason == "rejected"
    assert [held[i].outcome for i in range(1, 20)] == ["completed"] * 19
    assert held[0].outcome == "lost"


async def test_releases_that_fail_together_each_leave_their_lease_to_expire(
    redis_server: LocalRedis, namespace: str, redis: Redis
) -> None:
    """Redis stops answering as fifty holds end: every release fails, alone, and is reported."""
    end = anyio.Event()
    held: list[HeldLease] = []
    # 1 s per call: the acquires, ten at a time through the proxy, fit it on a loaded
    # machine (fifty at once did not at load 16); the releases all go at once.
    async with proxied_leases(redis_server, namespace, command_timeout=1.0) as (proxy, leases):

        async def holder(i: int, entered: anyio.Event) -> None:
            # 10 s: the keys outlive the failed releases and the checks below on a loaded
            # machine (at load 12, 3 s leases had expired by the time they were read).
            async with hold(leases, f"k{i}", lease_duration=10) as lease:
                held.append(lease)
                entered.set()
                await end.wait()

        async with anyio.create_task_group() as tg:
            await _start(tg, 50, holder, step=10)
            proxy.blackhole = True
            end.set()
    assert [h.outcome for h in held] == ["completed"] * 50  # the bodies' outcome stands
    assert all(isinstance(h.release_error, LeaseUnavailable) for h in held)
    assert all(h.released is None for h in held)
    for h in held:  # still this owner's, and expiring with its TTL
        assert await redis.get(leases.lease_key(h.key)) == h.lease.owner.encode()
        assert 0 < await redis.pttl(leases.lease_key(h.key)) <= 10_000
