"""One conformance suite for every lease store: RedisLeases on a real Redis, and MemoryLeases.

The same tests run against both (``backend`` is parametrized), so the
in-memory fake shipped in ``leaseworker.testing`` cannot drift from the real
store: owner tokens, fences (through release, deletion, expiry and a restart
without persistence), the local-deadline formula, key checks, and the
translation of a slow, silent or broken link into ``LeaseLost`` and
``LeaseUnavailable``. Both run on the normal event loop, in real time.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import anyio
import pytest
from redis.asyncio import Redis

from leaseworker import ConfigError, LeaseLost, LeaseStore, LeaseUnavailable, RedisLeases
from leaseworker.testing import MemoryLeases
from leaseworker_dev._services import LocalRedis, free_port

from ..chaos import proxied_leases

TIMEOUT = 0.5
"""The command timeout of a store whose link a test breaks (and of the in-memory store).

Short, as the timeout tests wait for it, yet a delayed reply of 0.1 s still comes well
inside it on a loaded machine (the ``late`` test).
"""

HEALTHY_TIMEOUT = 2.0
"""The command timeout of the Redis store on a healthy link: no call of it is a subject."""


Restart = Callable[[], Awaitable[LeaseStore]]
"""Restart the store's server empty; return a store connected to it again."""


class Switches(Protocol):
    """What a link can do (ChaosProxy's attributes, which MemoryLeases shares)."""

    blackhole: bool
    refuse: bool
    reply_delay: float


@dataclass
class Backend:
    """One lease store under test, and the operations the suite needs beside it."""

    name: str
    leases: LeaseStore
    delete: Callable[[str], Awaitable[None]]
    """The key vanishes, as an operator's DEL, eviction or a flush does."""
    exists: Callable[[str], Awaitable[bool]]
    faulty: Callable[[], contextlib.AbstractAsyncContextManager[tuple[Switches, LeaseStore]]]
    """A store of the same kind whose link the switches control."""
    restarted: Callable[
        [],
        contextlib.AbstractAsyncContextManager[
            tuple[LeaseStore, Callable[[], Awaitable[LeaseStore]]]
        ],
    ]
    """A fresh store, and a function that restarts its server empty and returns a new one."""
    dead: Callable[[], contextlib.AbstractAsyncContextManager[LeaseStore]]
    """A store whose server is not there at all."""


def _redis_backend(server: LocalRedis, redis: Redis, namespace: str) -> Backend:
    leases = RedisLeases(redis, namespace=namespace, command_timeout=HEALTHY_TIMEOUT)

    async def delete(key: str) -> None:
        await redis.delete(leases.lease_key(key))

    async def exists(key: str) -> bool:
        return bool(await redis.exists(leases.lease_key(key)))

    @contextlib.asynccontextmanager
    async def faulty() -> AsyncIterator[tuple[Switches, LeaseStore]]:
        async with proxied_leases(server, namespace, command_timeout=TIMEOUT) as (proxy, store):
            yield proxy, store

    @contextlib.asynccontextmanager
    async def restarted() -> AsyncIterator[tuple[LeaseStore, Restart]]:
        private = LocalRedis.start()
        clients: list[Redis] = []

        def connect() -> LeaseStore:
            client = Redis.from_url(private.url)
            clients.append(client)
            return RedisLeases(client, namespace="restart", command_timeout=HEALTHY_TIMEOUT)

        async def restart() -> LeaseStore:
            for client in clients:
                await client.aclose()
            private.restart_empty()
            return connect()

        try:
            yield connect(), restart
        finally:
            for client in clients:
                await client.aclose()
            private.stop()

    @contextlib.asynccontextmanager
    async def dead() -> AsyncIterator[LeaseStore]:
        client = Redis(host="127.0.0.1", port=free_port())
        try:
            yield RedisLeases(client, command_timeout=TIMEOUT)
        finally:
            await client.aclose()

    return Backend("redis", leases, delete, exists, faulty, restarted, dead)


def _memory_backend() -> Backend:
    leases = MemoryLeases(command_timeout=TIMEOUT)

    async def delete(key: str) -> None:
        leases.delete(key)

    async def exists(key: str) -> bool:
        return leases.holder(key) is not None

    @contextlib.asynccontextmanager
    async def faulty() -> AsyncIterator[tuple[Switches, LeaseStore]]:
        yield leases, leases

    @contextlib.asynccontextmanager
    async def restarted() -> AsyncIterator[tuple[LeaseStore, Restart]]:
        private = MemoryLeases()

        async def restart() -> LeaseStore:
            private.restart_empty()
            return private

        yield private, restart

    @contextlib.asynccontextmanager
    async def dead() -> AsyncIterator[LeaseStore]:
        down = MemoryLeases(command_timeout=TIMEOUT)
        down.refuse = True
        yield down

    return Backend("memory", leases, delete, exists, faulty, restarted, dead)


@pytest.fixture(params=["redis", "memory"])
def backend(request: pytest.FixtureRequest, namespace: str) -> Iterator[Backend]:
    """Each lease store in turn (Redis: the session's server, a namespace of the test's own)."""
    if request.param == "memory":
        yield _memory_backend()
        return
    server: LocalRedis = request.getfixturevalue("redis_server")
    redis: Redis = request.getfixturevalue("redis")
    yield _redis_backend(server, redis, namespace)


def _cut(switches: Switches) -> None:
    """Break the open connections too, where there are any (a proxy)."""
    cut = getattr(switches, "cut", None)
    if cut is not None:
        cut()


async def test_acquire_computes_a_conservative_local_deadline_from_the_send_time(
    backend: Backend,
) -> None:
    """The deadline is measured from when the acquire was sent, shortened by drift and margin."""
    before = anyio.current_time()
    lease = await backend.leases.acquire("report:acme:2026-11", lease_duration=2.0)
    assert lease is not None
    assert before <= lease.sent_at <= anyio.current_time()
    assert lease.local_deadline == pytest.approx(lease.sent_at + 2.0 * 0.99 - 0.05)
    assert await backend.exists("report:acme:2026-11")
    assert lease.owner not in repr(lease)  # the token authorises renew/release


async def test_acquire_while_held_returns_none(backend: Backend) -> None:
    """A second acquirer gets ``None``, not a second lease."""
    assert await backend.leases.acquire("k", lease_duration=5) is not None
    assert await backend.leases.acquire("k", lease_duration=5) is None


async def test_fences_strictly_increase_across_release_delete_and_expiry(backend: Backend) -> None:
    """Every acquisition gets a higher fence, however the previous lease ended."""
    leases, fences = backend.leases, []
    first = await leases.acquire("k", lease_duration=5)
    assert first is not None
    fences.append(first.fence)
    assert await leases.release(first)
    second = await leases.acquire("k", lease_duration=5)
    assert second is not None
    fences.append(second.fence)
    await backend.delete("k")
    third = await leases.acquire("k", lease_duration=0.05)
    assert third is not None
    fences.append(third.fence)
    with anyio.fail_after(5):
        while await backend.exists("k"):  # the store expires it  # noqa: ASYNC110
            await anyio.sleep(0.01)
    fourth = await leases.acquire("k", lease_duration=5)
    assert fourth is not None
    fences.append(fourth.fence)
    assert fences == sorted(set(fences))


async def test_each_acquisition_gets_its_predecessors_note(backend: Backend) -> None:
    """A note travels to the next acquisition, after a release or an expiry; ``""`` clears it."""
    leases = backend.leases
    first = await leases.acquire("k", lease_duration=5, note="one")
    assert first is not None
    assert first.previous is None
    assert await leases.release(first)
    second = await leases.acquire("k", lease_duration=0.05, note="two")
    assert second is not None
    assert second.previous == "one"
    with anyio.fail_after(5):
        while await backend.exists("k"):  # the store expires it  # noqa: ASYNC110
            await anyio.sleep(0.01)
    third = await leases.acquire("k", lease_duration=5)
    assert third is not None
    assert third.previous == "two"
    assert await leases.release(third)
    fourth = await leases.acquire("k", lease_duration=5, note="four")
    assert fourth is not None
    assert fourth.previous is None  # the third left none: no older note stands in for it


async def test_stale_owner_can_neither_renew_nor_release_a_newer_lease(backend: Backend) -> None:
    """The incident's late release: the old owner deletes nothing and renews nothing."""
    leases = backend.leases
    old = await leases.acquire("k", lease_duration=5)
    assert old is not None
    await backend.delete("k")  # the old lease expired
    new = await leases.acquire("k", lease_duration=5)
    assert new is not None
    assert new.fence > old.fence
    with pytest.raises(LeaseLost) as lost:
        await leases.renew(old)
    assert lost.value.reason == "rejected"
    assert lost.value.fence == old.fence
    assert await leases.release(old) is False
    assert (await leases.inspect("k")).owner == new.owner
    assert await leases.release(new) is True


async def test_renew_extends_the_deadline_from_its_own_send_time(backend: Backend) -> None:
    """A confirmed renewal moves the deadline forward; the fence stays."""
    lease = await backend.leases.acquire("k", lease_duration=1.0)
    assert lease is not None
    await anyio.sleep(0.01)
    renewed = await backend.leases.renew(lease)
    assert renewed.sent_at > lease.sent_at
    assert renewed.local_deadline == pytest.approx(renewed.sent_at + 1.0 * 0.99 - 0.05)
    assert renewed.local_deadline > lease.local_deadline
    assert renewed.fence == lease.fence
    remaining = (await backend.leases.inspect("k")).ttl
    assert remaining is not None
    assert remaining > 0.9


async def test_inspect_reports_owner_ttl_and_last_fence(backend: Backend) -> None:
    """Operators see who holds a key, for how long, and the last fence."""
    leases = backend.leases
    empty = await leases.inspect("k")
    assert (empty.owner, empty.ttl, empty.fence) == (None, None, None)
    lease = await leases.acquire("k", lease_duration=5)
    assert lease is not None
    info = await leases.inspect("k")
    assert info.owner == lease.owner
    assert info.ttl is not None
    assert 0 < info.ttl <= 5
    assert info.fence == lease.fence
    await leases.release(lease)
    released = await leases.inspect("k")
    assert (released.owner, released.ttl, released.fence) == (None, None, lease.fence)


async def test_fence_survives_a_restart_without_persistence(backend: Backend) -> None:
    """A store that comes back empty still hands out a higher fence than before."""
    async with backend.restarted() as (leases, restart):
        before = await leases.acquire("k", lease_duration=5)
        assert before is not None
        leases = await restart()
        assert (await leases.inspect("k")).fence is None  # the counter is really gone
        after = await leases.acquire("k", lease_duration=5)
        assert after is not None
        assert after.fence > before.fence


async def test_a_renewal_answered_after_the_deadline_is_late(backend: Backend) -> None:
    """A renewal that succeeds in the store but answers after the deadline is a loss."""
    async with backend.faulty() as (switches, leases):
        lease = await leases.acquire("k", lease_duration=5)
        assert lease is not None
        nearly_expired = dataclasses.replace(lease, local_deadline=anyio.current_time() + 0.05)
        switches.reply_delay = 0.1  # past the deadline, well inside the 0.5 s timeout
        with pytest.raises(LeaseLost) as lost:
            await leases.renew(nearly_expired)
        assert lost.value.reason == "late"
        switches.reply_delay = 0
        remaining = (await leases.inspect("k")).ttl
        assert remaining is not None
        assert remaining > 4  # the store did renew it


async def test_a_renewal_without_answer_is_a_timeout_loss(backend: Backend) -> None:
    """A black-holed renewal raises LeaseLost('timeout') within the command timeout."""
    async with backend.faulty() as (switches, leases):
        lease = await leases.acquire("k", lease_duration=5)
        assert lease is not None
        switches.blackhole = True
        with anyio.fail_after(2), pytest.raises(LeaseLost) as lost:
            await leases.renew(lease)
        assert lost.value.reason == "timeout"


async def test_a_renewal_on_a_broken_link_is_an_error_loss(backend: Backend) -> None:
    """A refused or reset connection during renewal is a loss, never a silent retry."""
    async with backend.faulty() as (switches, leases):
        lease = await leases.acquire("k", lease_duration=5)
        assert lease is not None
        switches.refuse = True
        _cut(switches)
        with anyio.fail_after(2), pytest.raises(LeaseLost) as lost:
            await leases.renew(lease)
        assert lost.value.reason == "error"


async def test_acquire_against_a_dead_server_raises_lease_unavailable(backend: Backend) -> None:
    """A store that is not there is a clear LeaseUnavailable, not a hang or a None."""
    async with backend.dead() as leases:
        with anyio.fail_after(2), pytest.raises(LeaseUnavailable, match="lease store unavailable"):
            await leases.acquire("k", lease_duration=5)


async def test_acquire_without_answer_releases_what_it_may_have_taken(backend: Backend) -> None:
    """An acquire whose reply is lost leaves no lease behind once the store answers again."""
    async with backend.faulty() as (switches, leases):
        switches.reply_delay = 0.8  # longer than the command timeout: the reply comes too late
        with pytest.raises(LeaseUnavailable):
            await leases.acquire("k", lease_duration=30)
        with anyio.fail_after(5):
            while await backend.exists("k"):  # noqa: ASYNC110 - external state
                await anyio.sleep(0.01)


async def test_an_empty_job_key_is_rejected(backend: Backend) -> None:
    """An empty hash tag would split lease and fence keys across cluster slots."""
    with pytest.raises(ConfigError, match="non-empty"):
        await backend.leases.acquire("", lease_duration=5)


@pytest.mark.parametrize("key", ["}x", "}"])
async def test_a_job_key_starting_with_a_closing_brace_is_rejected(
    backend: Backend, key: str
) -> None:
    """``}x`` makes the hash tag of ``ns:{}x}:lease`` empty: its two keys would split slots."""
    with pytest.raises(ConfigError, match="start with"):
        await backend.leases.acquire(key, lease_duration=5)


@pytest.mark.parametrize("key", ["tenant{1}", "a}b", "{"])
async def test_other_braces_in_a_job_key_are_fine(backend: Backend, key: str) -> None:
    """The hash tag ends at the first ``}``: both keys of the job still share it."""
    lease = await backend.leases.acquire(key, lease_duration=5)
    assert lease is not None
    assert await backend.leases.release(lease) is True


@pytest.mark.parametrize("lease_duration", [0, 0.001, -1])
async def test_a_ttl_of_a_millisecond_or_less_is_rejected(
    backend: Backend, lease_duration: float
) -> None:
    """A TTL the store would round to nothing cannot keep a lease."""
    with pytest.raises(ConfigError, match="lease_duration"):
        await backend.leases.acquire("k", lease_duration=lease_duration)
