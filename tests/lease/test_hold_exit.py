"""hold()'s exit is bounded whatever the lease client does with a cancellation."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from leaseworker import Lease, LeaseInfo, RedisLeases, hold
from leaseworker._lease import DeadlinePolicy


class _SwallowingRenew:
    """Real leases whose renew swallows cancellations, as a client's ``wait_for`` can.

    On Python 3.11, redis-py sends each command inside ``asyncio.wait_for`` when
    the client has a ``socket_timeout``; a cancellation that races the send's
    completion is dropped there. That race is too narrow to hit on purpose with
    a real socket, so this double drops the cancellation deterministically.

    ``renew`` signals ``started``, then waits for ``reply``; each cancellation
    meanwhile is dropped (counted in ``swallowed``). With ``hang`` it never
    answers until ``reply`` is set; otherwise the first cancellation lets the
    real renewal go through, the way a reply racing the cancel does. ``answered``
    is set once the real renewal answered.
    """

    def __init__(self, inner: RedisLeases, *, hang: bool) -> None:
        self.inner = inner
        self.hang = hang
        self.started = anyio.Event()
        self.reply = asyncio.Event()
        self.answered = asyncio.Event()
        self.renews = 0
        self.swallowed = 0

    @property
    def policy(self) -> DeadlinePolicy:
        return self.inner.policy

    async def acquire(self, key: str, lease_duration: float, *, note: str = "") -> Lease | None:
        return await self.inner.acquire(key, lease_duration, note=note)

    async def renew(self, lease: Lease) -> Lease:
        self.renews += 1
        self.started.set()
        while not self.reply.is_set():
            try:
                await self.reply.wait()
            except asyncio.CancelledError:
                self.swallowed += 1
                asyncio.current_task().uncancel()  # type: ignore[union-attr]
                if not self.hang:
                    break
        try:
            return await self.inner.renew(lease)
        finally:
            self.answered.set()

    async def release(self, lease: Lease) -> bool:
        return await self.inner.release(lease)

    async def inspect(self, key: str) -> LeaseInfo:
        return await self.inner.inspect(key)


@pytest.mark.fake  # a renew that swallows its cancellation, around real Redis
@pytest.mark.timeout(20)  # without the fix this test hangs: the timeout is its failure
async def test_a_swallowed_cancellation_does_not_keep_the_lease_renewing(
    leases: RedisLeases,
) -> None:
    """The renewal in flight at exit answers anyway: no further renewal, exit, release."""
    swallowing = _SwallowingRenew(leases, hang=False)
    async with hold(swallowing, "k", lease_duration=3, renewal_interval=0.1) as held:
        await swallowing.started.wait()
    assert swallowing.swallowed == 1
    assert swallowing.renews == 1
    assert held.outcome == "completed"
    assert held.released is True
    assert (await leases.inspect("k")).owner is None


@pytest.mark.fake  # a renew that swallows every cancellation, around real Redis
@pytest.mark.timeout(20)  # if the exit waited for the renewal, it would hang: that is the failure
async def test_a_renewal_that_never_stops_does_not_hold_up_the_exit(leases: RedisLeases) -> None:
    """Exit does not wait for the renewal in flight; its late answer changes nothing."""
    swallowing = _SwallowingRenew(leases, hang=True)
    try:
        async with hold(
            swallowing, "k", lease_duration=3, renewal_interval=0.1, release_timeout=0.3
        ) as held:
            await swallowing.started.wait()
        assert not swallowing.reply.is_set()  # the renewal is still in flight
        assert held.outcome == "completed"
        assert held.released is True
        assert swallowing.swallowed == 1  # cancelled once, never awaited
    finally:
        swallowing.reply.set()  # let the abandoned renewal end: nothing left running
    await swallowing.answered.wait()
    assert held.renewals == 0
    assert (await leases.inspect("k")).owner is None  # the late renewal found the key released
