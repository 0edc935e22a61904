"""hold(): the body runs only while the lease is certainly owned (real Redis)."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis

from leaseworker import (
    ConfigError,
    Event,
    HeldLease,
    Lease,
    LeaseBusy,
    LeaseEvent,
    LeaseInfo,
    LeaseLost,
    LeaseTimeout,
    LeaseUnavailable,
    RedisLeases,
    hold,
)
from leaseworker._lease import DeadlinePolicy
from leaseworker_dev._services import LocalRedis

from ..chaos import proxied_leases


async def test_renewal_keeps_a_body_alive_for_five_ttls(
    leases: RedisLeases, short_timeout_leases: RedisLeases
) -> None:
    """A body running 5x the TTL completes, and nobody can acquire meanwhile.

    The holder outlives five leases of 0.5 s (too short for 2 s calls); the
    rival's acquires, not the subject, take the generous store of the same keys.
    """
    lease_duration = 0.5
    async with hold(short_timeout_leases, "k", lease_duration=lease_duration) as held:
        until = anyio.current_time() + 5 * lease_duration
        while anyio.current_time() < until:
            assert await leases.acquire("k", lease_duration=lease_duration) is None
            await held.checkpoint()
            await anyio.sleep(lease_duration / 5)
    assert held.outcome == "completed"
    assert held.renewals >= 12
    assert held.released is True
    assert (await leases.inspect("k")).owner is None


@pytest.mark.parametrize("theft", ["steal", "delete"])
async def test_stolen_or_deleted_lease_cancels_the_body_within_one_renewal(
    leases: RedisLeases, redis: Redis, theft: str
) -> None:
    """Losing the key in Redis stops the body at its next await and raises LeaseLost."""
    started, stopped = anyio.Event(), anyio.Event()
    lost_at = 0.0

    async def take_the_key() -> None:
        nonlocal lost_at
        await started.wait()
        lost_at = anyio.current_time()
        key = leases.lease_key("k")
        if theft == "steal":
            await redis.set(key, b"thief", px=10_000)
        else:
            await redis.delete(key)

    async with anyio.create_task_group() as tg:
        tg.start_soon(take_the_key)
        with pytest.raises(LeaseLost) as lost:
            async with hold(leases, "k", lease_duration=3, renewal_interval=0.3) as held:
                started.set()
                try:
                    await anyio.sleep_forever()
                finally:
                    stopped.set()
    assert stopped.is_set()
    assert lost.value.reason == "rejected"
    assert lost.value.key == "k"
    assert lost.value.fence == held.fence
    assert lost.value.stop_latency is not None
    assert lost.value.stop_latency < 0.2  # at its next await; slack for a loaded CI machine
    assert anyio.current_time() - lost_at < 0.3 + 0.2  # one renewal interval + its round trip
    assert held.outcome == "lost"
    assert held.owned is False
    assert held.released is False  # the thief's key (or no key) is left alone


async def test_checkpoint_raises_lease_lost_once_ownership_is_uncertain(
    leases: RedisLeases, redis: Redis
) -> None:
    """A body that only calls checkpoint() learns of the loss from checkpoint itself."""
    with pytest.raises(LeaseLost) as lost:
        async with hold(leases, "k", lease_duration=3, renewal_interval=0.3) as held:
            await redis.delete(leases.lease_key("k"))
            while True:
                await held.checkpoint()
    assert lost.value.reason == "rejected"
    assert held.remaining() == 0.0


async def test_unreachable_redis_stops_the_body_before_the_key_can_expire(
    redis_server: LocalRedis, redis: Redis, namespace: str
) -> None:
    """Black-holed renewals: the body stops by its local deadline while the key still lives.

    A direct connection checks PTTL > 0 at the moment the body stopped, and a
    second worker, trying all along, acquires only after that. The second
    worker's calls are not the subject: a budget of their own that a loaded
    machine cannot exhaust (at 0.2 s, its first call, which opens the
    connection, or any later one running late raised LeaseUnavailable out of
    the test).
    """
    direct = RedisLeases(redis, namespace=namespace, command_timeout=5.0)
    stopped_at: float | None = None
    key_pttl_at_stop = -2
    second_acquired_at: float | None = None
    started = anyio.Event()

    async def second_worker() -> None:
        nonlocal second_acquired_at
        await started.wait()
        # A rival pod polls Redis, like a real one would.
        while (lease := await direct.acquire("k", lease_duration=1.0)) is None:  # noqa: ASYNC110
            await anyio.sleep(0.005)
        second_acquired_at = anyio.current_time()
        await direct.release(lease)

    async with (
        proxied_leases(redis_server, namespace, command_timeout=0.2) as (proxy, leases),
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(second_worker)
        with pytest.raises(LeaseLost) as lost:
            async with hold(leases, "k", lease_duration=1.0, renewal_interval=0.25) as held:
                proxy.blackhole = True
                started.set()
                try:
                    await anyio.sleep_forever()
                finally:
                    stopped_at = anyio.current_time()
                    with anyio.CancelScope(shield=True):
                        key_pttl_at_stop = await redis.pttl(direct.lease_key("k"))
    assert lost.value.reason in {"timeout", "deadline"}
    assert stopped_at is not None
    assert second_acquired_at is not None
    assert stopped_at <= held.lease.local_deadline + 0.01  # the cancel fires at the deadline
    assert key_pttl_at_stop > 0
    assert second_acquired_at > stopped_at
    assert held.release_error is not None  # release could not reach Redis either


async def test_slow_redis_answers_too_late_to_extend_the_deadline(
    redis_server: LocalRedis, redis: Redis, namespace: str
) -> None:
    """Renewals delayed past the deadline do not revive the body; the key outlives it."""
    key_pttl_at_stop = -2
    async with proxied_leases(redis_server, namespace, command_timeout=0.3) as (proxy, leases):
        with pytest.raises(LeaseLost) as lost:
            async with hold(leases, "k", lease_duration=1.0, renewal_interval=0.3) as held:
                proxy.reply_delay = 0.8
                try:
                    await anyio.sleep_forever()
                finally:
                    with anyio.CancelScope(shield=True):
                        key_pttl_at_stop = await redis.pttl(leases.lease_key("k"))
    assert lost.value.reason in {"timeout", "late", "deadline"}
    assert key_pttl_at_stop > 0
    assert held.outcome == "lost"


async def test_max_runtime_stops_a_body_while_renewal_succeeds(leases: RedisLeases) -> None:
    """The runtime bound holds even when the lease is healthy."""
    with pytest.raises(LeaseTimeout) as timeout:
        async with hold(
            leases, "k", lease_duration=3, renewal_interval=0.15, max_runtime=0.7
        ) as held:
            await anyio.sleep_forever()
    assert timeout.value.max_runtime == 0.7
    assert held.renewals >= 2
    assert held.outcome == "timed_out"
    assert held.released is True


async def test_shutdown_while_a_timed_out_body_stops_stays_a_cancellation(
    leases: RedisLeases,
) -> None:
    """max_runtime cancels the body; shutdown comes during its cleanup: it is not lost.

    The caller's cancellation goes on out of ``hold`` (the timeout is noted on
    it) instead of being replaced by LeaseTimeout, which is not a cancellation
    and would make shutdown count the trigger as done.
    """
    cleaning, finish = anyio.Event(), anyio.Event()
    outer = anyio.CancelScope()
    seen: list[HeldLease] = []

    async def run_body() -> None:
        with outer:
            async with hold(leases, "k", lease_duration=4, max_runtime=0.1) as held:
                seen.append(held)
                try:
                    await anyio.sleep_forever()
                finally:
                    with anyio.CancelScope(shield=True):  # a cleanup that takes a while
                        cleaning.set()
                        await finish.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_body)
        await cleaning.wait()  # max_runtime has cancelled the body
        outer.cancel()  # shutdown
        finish.set()
    assert outer.cancelled_caught
    [held] = seen
    assert held.outcome == "timed_out"
    assert held.released is True


async def test_a_timed_out_body_stopping_past_the_local_deadline_is_reported_lost(
    short_timeout_leases: RedisLeases,
) -> None:
    """A timed-out body whose cleanup blocks the loop past the deadline may have overlapped.

    It is lost, and ``loop_blocked``: the renewal due meanwhile was never sent. That
    needs the cleanup to begin before the first renewal is due (0.1 s after the acquire
    was sent). On a loaded machine the acquire's answer and ``max_runtime`` can come later
    than that: the renewal went out, the loss is ``deadline``, and the hold runs again
    (at most five times; each attempt says which it was).
    """
    for _ in range(5):
        early = False
        with pytest.raises(LeaseLost) as lost:
            async with hold(  # a stall past a 0.4 s lease: too short for 2 s calls
                short_timeout_leases,
                "k",
                lease_duration=0.4,
                renewal_interval=0.1,
                max_runtime=0.05,
            ) as held:
                try:
                    await anyio.sleep_forever()
                finally:
                    early = anyio.current_time() < held.lease.sent_at + 0.1
                    time.sleep(0.6)  # noqa: ASYNC251 - a cleanup that blocks the loop past the TTL
        assert held.outcome == "lost"
        if early:
            break
        assert lost.value.reason == "deadline"  # the renewal was sent before the block
    assert early, "in five attempts no cleanup began before the first renewal was due"
    assert lost.value.reason == "loop_blocked"
    assert lost.value.stop_latency is not None
    assert lost.value.stop_latency > 0.1


async def test_busy_lease_raises_lease_busy_with_the_holders_ttl(leases: RedisLeases) -> None:
    """Another live owner means LeaseBusy, with a hint for when to retry."""
    assert await leases.acquire("k", lease_duration=5) is not None
    with pytest.raises(LeaseBusy) as busy:
        async with hold(leases, "k", lease_duration=4):
            pytest.fail("the body must not run")
    assert busy.value.retry_after is not None
    assert 0 < busy.value.retry_after <= 5


async def test_a_holder_that_expires_before_its_ttl_is_read_means_retry_now(
    leases: RedisLeases, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused, then the holder's key expires before its TTL is read: the hint is 0, not None.

    None (unknown) makes a busy pod wait a whole backoff step past the expiry (up to
    its cap, 5 s by default): a takeover seconds late.
    """
    assert await leases.acquire("k", lease_duration=5) is not None
    acquire = leases.acquire

    async def refused_then_expired(key: str, lease_duration: float, **kw: Any) -> Any:
        lease = await acquire(key, lease_duration, **kw)
        await redis.delete(leases.lease_key(key))  # the holder's TTL ran out meanwhile
        return lease

    monkeypatch.setattr(leases, "acquire", refused_then_expired)
    with pytest.raises(LeaseBusy) as busy:
        async with hold(leases, "k", lease_duration=4):
            pytest.fail("the body must not run")
    assert busy.value.retry_after == 0


async def test_outer_cancellation_still_releases_the_lease(leases: RedisLeases) -> None:
    """Shutdown cancels the body; the shielded release still deletes the key."""
    with anyio.CancelScope() as outer:
        async with hold(leases, "k", lease_duration=4) as held:
            outer.cancel()
            await anyio.sleep_forever()
    assert held.outcome == "cancelled"
    assert held.released is True
    assert (await leases.inspect("k")).owner is None


class _FailingRelease:
    """A real RedisLeases whose release always fails (test double for one method)."""

    def __init__(self, inner: RedisLeases) -> None:
        self.inner = inner

    @property
    def policy(self) -> DeadlinePolicy:
        return self.inner.policy

    async def acquire(self, key: str, lease_duration: float, *, note: str = "") -> Lease | None:
        return await self.inner.acquire(key, lease_duration, note=note)

    async def renew(self, lease: Lease) -> Lease:
        return await self.inner.renew(lease)

    async def release(self, lease: Lease) -> bool:
        raise LeaseUnavailable(lease.key, "injected release failure")

    async def inspect(self, key: str) -> LeaseInfo:
        return await self.inner.inspect(key)


@pytest.mark.fake  # a release that always fails, around real Redis
async def test_failing_release_never_hides_the_bodys_exception(leases: RedisLeases) -> None:
    """The body's own error is what the caller sees; the release error is reported aside."""
    with pytest.raises(ZeroDivisionError):
        async with hold(_FailingRelease(leases), "k", lease_duration=4) as held:
            _ = 1 / 0
    assert held.outcome == "failed"
    assert isinstance(held.release_error, LeaseUnavailable)
    assert held.released is None


@pytest.mark.fake  # a release that always fails, around real Redis
async def test_failing_release_does_not_turn_success_into_failure(leases: RedisLeases) -> None:
    """A completed body stays completed when only the release fails."""
    async with hold(_FailingRelease(leases), "k", lease_duration=4) as held:
        await held.checkpoint()
    assert held.outcome == "completed"
    assert isinstance(held.release_error, LeaseUnavailable)


async def test_body_blocking_the_loop_past_its_deadline_is_reported_lost(
    short_timeout_leases: RedisLeases,
) -> None:
    """A body that never awaits cannot be preempted; on wake it is reported lost."""
    leases = short_timeout_leases  # a stall past a lease under 1 s: too short for 2 s calls
    with pytest.raises(LeaseLost) as lost:
        async with hold(leases, "k", lease_duration=0.4, renewal_interval=0.1):
            time.sleep(0.6)  # noqa: ASYNC251 - the point: a body that blocks the loop
    assert lost.value.reason == "loop_blocked"
    assert lost.value.stop_latency is not None
    assert lost.value.stop_latency > 0.1


@pytest.mark.parametrize("first_await", ["checkpoint", "sleep"])
async def test_body_blocking_then_awaiting_is_stopped_at_that_await(
    short_timeout_leases: RedisLeases, first_await: str
) -> None:
    """After a stall past the deadline, the body's next await stops it."""
    leases = short_timeout_leases  # a stall past a lease under 1 s: too short for 2 s calls
    reached_after_stall = False
    with pytest.raises(LeaseLost) as lost:
        async with hold(leases, "k", lease_duration=0.4, renewal_interval=0.1) as held:
            time.sleep(0.6)  # noqa: ASYNC251 - a loop stall, e.g. a long GC pause
            if first_await == "checkpoint":
                await held.checkpoint()
            else:
                await anyio.sleep(0.01)
            reached_after_stall = True
    assert not reached_after_stall
    assert lost.value.reason == "loop_blocked"  # before the first renewal too (issue 17)
    assert lost.value.stop_latency is not None
    assert lost.value.stop_latency >= 0.1  # stopped long after the deadline: the stall shows


@pytest.mark.parametrize("first_await", ["checkpoint", "sleep"])
async def test_body_blocking_after_the_first_renewal_is_loop_blocked_too(
    short_timeout_leases: RedisLeases, first_await: str
) -> None:
    """A stall that begins after a confirmed renewal gets the same reason as one before it.

    The body waits for the first ``renewed`` event, so its stall starts a
    quarter of a second before the second renewal is due: that one is never sent.
    """
    leases = short_timeout_leases  # a stall past a lease under 1 s: too short for 2 s calls
    renewed = anyio.Event()
    with pytest.raises(LeaseLost) as lost:
        async with hold(
            leases, "k", lease_duration=0.8, renewal_interval=0.25, hooks=[_OnRenewed(renewed)]
        ) as held:
            await renewed.wait()
            time.sleep(0.8)  # noqa: ASYNC251 - a loop stall after the first renewal
            if first_await == "checkpoint":
                await held.checkpoint()
            else:
                await anyio.sleep(0.01)
    assert lost.value.reason == "loop_blocked"


class _OnRenewed:
    """A lease observer that sets ``event`` at the first confirmed renewal."""

    def __init__(self, event: anyio.Event) -> None:
        self.event = event

    def __call__(self, event: Event) -> None:
        assert isinstance(event, LeaseEvent)
        if event.name == "renewed":
            self.event.set()


class _SilentRenewals:
    """A real RedisLeases whose renewals never answer (test double for one method)."""

    def __init__(self, inner: RedisLeases) -> None:
        self.inner = inner
        self.renewing = anyio.Event()

    @property
    def policy(self) -> DeadlinePolicy:
        return self.inner.policy

    async def acquire(self, key: str, lease_duration: float, *, note: str = "") -> Lease | None:
        return await self.inner.acquire(key, lease_duration, note=note)

    async def renew(self, lease: Lease) -> Lease:
        self.renewing.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def release(self, lease: Lease) -> bool:
        return await self.inner.release(lease)

    async def inspect(self, key: str) -> LeaseInfo:
        return await self.inner.inspect(key)


@pytest.mark.fake  # renewals that never answer, around real Redis
@pytest.mark.parametrize("first_await", ["checkpoint", "sleep"])
async def test_a_renewal_sent_but_never_confirmed_is_deadline_not_loop_blocked(
    leases: RedisLeases, first_await: str
) -> None:
    """The renewal went out in time and got no answer: ``deadline``, even if a stall follows."""
    silent = _SilentRenewals(leases)
    with pytest.raises(LeaseLost) as lost:
        async with hold(silent, "k", lease_duration=2.5, renewal_interval=0.25) as held:
            await silent.renewing.wait()
            time.sleep(held.remaining() + 0.05)  # noqa: ASYNC251 - past the deadline
            if first_await == "checkpoint":
                await held.checkpoint()
            else:
                await anyio.sleep(0.01)
    assert lost.value.reason == "deadline"


@pytest.mark.fake
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lease_duration": 0}, "lease_duration must be > 0"),
        ({"lease_duration": 1, "renewal_interval": 1}, "shorter than lease_duration"),
        ({"lease_duration": 1, "renewal_interval": 0}, "renewal_interval must be > 0"),
        ({"lease_duration": 1, "renewal_interval": 0.6}, "must end before the local deadline"),
        ({"lease_duration": 0.04}, "no validity"),
        ({"lease_duration": 1, "max_runtime": 0}, "max_runtime"),
    ],
)
def test_invalid_timing_is_rejected_before_touching_redis(
    kwargs: dict[str, Any], match: str
) -> None:
    """Pure check: settings that cannot keep the lease fail at construction."""
    store = RedisLeases(Redis(host="127.0.0.1", port=1), command_timeout=0.5)
    with pytest.raises(ConfigError, match=match):
        hold(store, "k", **kwargs)


async def test_a_held_lease_cannot_be_entered_twice(leases: RedisLeases) -> None:
    """Each acquisition is one HeldLease; reuse is a programming error."""
    held: HeldLease = hold(leases, "k", lease_duration=4)
    async with held:
        pass
    with pytest.raises(RuntimeError, match="only once"):
        async with held:
            pass


class _Recorder:
    """Collects lease events in order (a plain in-memory observer)."""

    def __init__(self) -> None:
        self.events: list[LeaseEvent] = []
        self.third_renewal = anyio.Event()

    def __call__(self, event: Event) -> None:
        assert isinstance(event, LeaseEvent)
        self.events.append(event)
        if self.names.count("renewed") == 3:
            self.third_renewal.set()

    @property
    def names(self) -> list[str]:
        return [event.name for event in self.events]


async def test_observer_sees_acquire_renewals_and_release_of_a_completed_hold(
    leases: RedisLeases,
) -> None:
    """Every renewal is reported with its round trip and the validity it bought."""
    recorder = _Recorder()
    async with hold(leases, "k", lease_duration=3, renewal_interval=0.15, hooks=[recorder]) as held:
        await recorder.third_renewal.wait()
    assert recorder.names[0] == "acquired"
    assert recorder.names[-1] == "released"
    renewed = [e for e in recorder.events if e.name == "renewed"]
    assert len(renewed) == held.renewals
    for event in renewed:
        assert event.round_trip is not None
        assert event.remaining is not None
        assert 0 < event.remaining <= 3
        assert event.fence == held.fence
    assert recorder.events[-1].deleted is True


async def test_observer_sees_loss_cancel_and_stop_latency(
    leases: RedisLeases, redis: Redis
) -> None:
    """A loss is reported as lost -> cancel_requested -> stopped (with latency) -> released."""
    recorder = _Recorder()
    with pytest.raises(LeaseLost):
        async with hold(leases, "k", lease_duration=3, renewal_interval=0.15, hooks=[recorder]):
            await redis.delete(leases.lease_key("k"))
            await anyio.sleep_forever()
    tail = recorder.names[recorder.names.index("lost") :]
    assert tail == ["lost", "cancel_requested", "stopped", "released"]
    lost = recorder.events[recorder.names.index("lost")]
    assert lost.reason == "rejected"
    stopped = recorder.events[recorder.names.index("stopped")]
    assert stopped.stop_latency is not None
    assert stopped.stop_latency >= 0
    assert recorder.events[-1].deleted is False


class _Broken:
    """An observer that always raises, and counts how often it was asked."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, event: Event) -> None:
        assert isinstance(event, LeaseEvent)
        self.calls += 1
        raise RuntimeError("observer bug")


async def test_a_failing_observer_never_changes_the_outcome(
    leases: RedisLeases, caplog: pytest.LogCaptureFixture
) -> None:
    """Observer errors are logged and swallowed; the body completes and releases."""
    broken = _Broken()
    async with hold(leases, "k", lease_duration=4, hooks=[broken]) as held:
        await held.checkpoint()
    assert held.outcome == "completed"
    assert held.released is True
    assert broken.calls == 2  # acquired, released: it was asked, and raised, each time
    failures = [r for r in caplog.records if r.getMessage().startswith("hook ")]
    assert len(failures) == 2
