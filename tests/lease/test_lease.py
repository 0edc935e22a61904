"""RedisLeases against a real redis-server: scripts, owner tokens, fences, deadlines."""

from __future__ import annotations

import dataclasses

import anyio
import pytest
from redis.asyncio import Redis

from leaseworker import ConfigError, LeaseLost, LeaseUnavailable, RedisLeases
from leaseworker._dev._services import LocalRedis, free_port
from leaseworker._lease._leases import _ms

from ..chaos import proxied_leases
from ..waiting import eventually


async def _absent(redis: Redis, key: str) -> bool:
    return not await redis.exists(key)


async def test_acquire_sets_owner_ttl_and_conservative_local_deadline(
    leases: RedisLeases, redis: Redis
) -> None:
    """The deadline is computed from the send time, shortened by drift and margin."""
    before = anyio.current_time()
    lease = await leases.acquire("report:acme:2026-11", ttl=2.0)
    assert lease is not None
    assert before <= lease.sent_at
    assert lease.local_deadline == pytest.approx(lease.sent_at + 2.0 * 0.99 - 0.05)
    assert await redis.get(leases.lease_key(lease.key)) == lease.owner.encode()
    assert 0 < await redis.pttl(leases.lease_key(lease.key)) <= 2000
    assert leases.lease_key("k") == f"{leases.namespace}:{{k}}:lease"
    assert leases.fence_key("k") == f"{leases.namespace}:{{k}}:fence"


async def test_each_acquisition_gets_the_note_its_predecessor_left(
    leases: RedisLeases, redis: Redis
) -> None:
    """The note travels to the next acquisition, however the lease ended; ``""`` clears it."""
    first = await leases.acquire("k", ttl=5, note="one")
    assert first is not None
    assert first.previous is None
    assert await leases.release(first)
    second = await leases.acquire("k", ttl=0.05, note="two")
    assert second is not None
    assert second.previous == "one"
    await eventually(lambda: _absent(redis, leases.lease_key("k")))  # expired, not released
    third = await leases.acquire("k", ttl=5)
    assert third is not None
    assert third.previous == "two"
    assert await leases.release(third)
    fourth = await leases.acquire("k", ttl=5, note="four")
    assert fourth is not None
    assert fourth.previous is None  # the third left none: no older note stands in for it
    assert await redis.get(leases.note_key("k")) == b"four"
    assert leases.note_key("k") == f"{leases.namespace}:{{k}}:note"


async def test_acquire_while_held_returns_none(leases: RedisLeases) -> None:
    """A second acquirer gets ``None``, not a second lease."""
    assert await leases.acquire("k", ttl=5) is not None
    assert await leases.acquire("k", ttl=5) is None


async def test_fences_strictly_increase_across_release_delete_and_expiry(
    leases: RedisLeases, redis: Redis
) -> None:
    """Every acquisition gets a higher fence, however the previous lease ended."""
    fences = []
    first = await leases.acquire("k", ttl=5)
    assert first is not None
    fences.append(first.fence)
    assert await leases.release(first)
    second = await leases.acquire("k", ttl=5)
    assert second is not None
    fences.append(second.fence)
    await redis.delete(leases.lease_key("k"))  # an operator, or a flush
    third = await leases.acquire("k", ttl=0.05)
    assert third is not None
    fences.append(third.fence)
    await eventually(lambda: _absent(redis, leases.lease_key("k")))  # Redis expires it
    fourth = await leases.acquire("k", ttl=5)
    assert fourth is not None
    fences.append(fourth.fence)
    assert fences == sorted(set(fences))


async def test_stale_owner_can_neither_renew_nor_release_newer_lease(
    leases: RedisLeases, redis: Redis
) -> None:
    """The incident's late release: the old owner deletes nothing and renews nothing."""
    old = await leases.acquire("k", ttl=5)
    assert old is not None
    await redis.delete(leases.lease_key("k"))  # the old lease expired
    new = await leases.acquire("k", ttl=5)
    assert new is not None
    assert new.fence > old.fence
    with pytest.raises(LeaseLost) as lost:
        await leases.renew(old)
    assert lost.value.reason == "rejected"
    assert await leases.release(old) is False
    assert await redis.get(leases.lease_key("k")) == new.owner.encode()
    assert await leases.release(new) is True


async def test_renew_extends_ttl_and_deadline(leases: RedisLeases, redis: Redis) -> None:
    """A confirmed renewal moves the deadline forward from its own send time."""
    lease = await leases.acquire("k", ttl=1.0)
    assert lease is not None
    await redis.pexpire(leases.lease_key("k"), 100)
    renewed = await leases.renew(lease)
    assert renewed.sent_at > lease.sent_at
    assert renewed.local_deadline > lease.local_deadline
    assert renewed.fence == lease.fence
    assert await redis.pttl(leases.lease_key("k")) > 500


async def test_scripts_run_by_sha_reload_after_flush_and_take_keys_as_arguments(
    leases: RedisLeases, redis: Redis
) -> None:
    """After SCRIPT FLUSH the scripts reload once; many keys still mean three scripts."""
    await redis.script_flush()
    for key in ("a", "b", "c"):
        lease = await leases.acquire(key, ttl=5)
        assert lease is not None
        await leases.renew(lease)
        await leases.release(lease)
    info = await redis.info("memory")
    assert info["number_of_cached_scripts"] == 3  # a key spliced into the text would add more


async def test_inspect_reports_owner_ttl_and_last_fence(leases: RedisLeases) -> None:
    """Operators see who holds a key, for how long, and the last fence."""
    empty = await leases.inspect("k")
    assert (empty.owner, empty.ttl, empty.fence) == (None, None, None)
    lease = await leases.acquire("k", ttl=5)
    assert lease is not None
    info = await leases.inspect("k")
    assert info.owner == lease.owner
    assert info.ttl is not None
    assert 0 < info.ttl <= 5
    assert info.fence == lease.fence
    await leases.release(lease)
    released = await leases.inspect("k")
    assert (released.owner, released.fence) == (None, lease.fence)


async def test_fence_survives_redis_restart_without_persistence() -> None:
    """A Redis that comes back empty still hands out a higher fence than before."""
    server = LocalRedis.start()
    try:
        client = Redis.from_url(server.url)
        leases = RedisLeases(client, namespace="restart")
        before = await leases.acquire("k", ttl=5)
        assert before is not None
        await client.aclose()
        server.restart_empty()
        client = Redis.from_url(server.url)
        leases = RedisLeases(client, namespace="restart")
        assert (await leases.inspect("k")).fence is None  # the counter is really gone
        after = await leases.acquire("k", ttl=5)
        assert after is not None
        assert after.fence > before.fence
        await client.aclose()
    finally:
        server.stop()


async def test_late_renewal_reply_does_not_extend_the_deadline(
    redis_server: LocalRedis, namespace: str, redis: Redis
) -> None:
    """A renewal that succeeds in Redis but answers after the deadline is a loss."""
    async with proxied_leases(redis_server, namespace) as (proxy, proxied):
        lease = await proxied.acquire("k", ttl=5)
        assert lease is not None
        nearly_expired = dataclasses.replace(lease, local_deadline=anyio.current_time() + 0.05)
        proxy.reply_delay = 0.15
        with pytest.raises(LeaseLost) as lost:
            await proxied.renew(nearly_expired)
        assert lost.value.reason == "late"
        assert await redis.pttl(proxied.lease_key("k")) > 4000  # Redis did renew it


async def test_renewal_without_answer_is_a_timeout_loss(
    redis_server: LocalRedis, namespace: str
) -> None:
    """A black-holed renewal raises LeaseLost('timeout') within the command timeout."""
    async with proxied_leases(redis_server, namespace) as (proxy, proxied):
        lease = await proxied.acquire("k", ttl=5)
        assert lease is not None
        proxy.blackhole = True
        with anyio.fail_after(2), pytest.raises(LeaseLost) as lost:
            await proxied.renew(lease)
        assert lost.value.reason == "timeout"


async def test_renewal_on_a_cut_connection_is_an_error_loss(
    redis_server: LocalRedis, namespace: str
) -> None:
    """A reset connection during renewal is a loss, never a silent retry."""
    async with proxied_leases(redis_server, namespace) as (proxy, proxied):
        lease = await proxied.acquire("k", ttl=5)
        assert lease is not None
        proxy.refuse = True
        proxy.cut()
        with anyio.fail_after(2), pytest.raises(LeaseLost) as lost:
            await proxied.renew(lease)
        assert lost.value.reason == "error"


async def test_acquire_against_a_dead_server_raises_lease_unavailable() -> None:
    """Redis down at acquire is a clear LeaseUnavailable, not a hang or a None."""
    client = Redis(host="127.0.0.1", port=free_port())
    leases = RedisLeases(client, command_timeout=0.2)
    with anyio.fail_after(2), pytest.raises(LeaseUnavailable, match="lease store unavailable"):
        await leases.acquire("k", ttl=5)
    await client.aclose()


async def test_acquire_without_answer_releases_what_it_may_have_taken(
    redis_server: LocalRedis, namespace: str, redis: Redis
) -> None:
    """An acquire whose reply is lost leaves no lease behind once Redis answers again."""
    async with proxied_leases(redis_server, namespace) as (proxy, proxied):
        proxy.reply_delay = 0.5  # longer than command_timeout: the reply comes too late
        with pytest.raises(LeaseUnavailable):
            await proxied.acquire("k", ttl=30)
        await eventually(lambda: _absent(redis, proxied.lease_key("k")))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"namespace": "a{b}"}, "braces"),
        ({"namespace": ""}, "non-empty"),
        ({"drift": 0.6}, "drift"),
        ({"margin": -1}, "margin"),
        ({"command_timeout": 0}, "command_timeout"),
    ],
)
def test_invalid_store_settings_raise_config_error(
    kwargs: dict[str, object], match: str, redis: Redis
) -> None:
    """Pure check of constructor validation (no Redis call is made)."""
    with pytest.raises(ConfigError, match=match):
        RedisLeases(redis, **kwargs)  # type: ignore[arg-type]


async def test_empty_job_key_is_rejected(leases: RedisLeases) -> None:
    """An empty hash tag would split lease and fence keys across cluster slots."""
    with pytest.raises(ConfigError, match="non-empty"):
        await leases.acquire("", ttl=5)


@pytest.mark.parametrize("key", ["}x", "}"])
async def test_a_job_key_starting_with_a_closing_brace_is_rejected(
    leases: RedisLeases, key: str
) -> None:
    """``}x`` makes the hash tag of ``ns:{}x}:lease`` empty: its two keys would split slots."""
    with pytest.raises(ConfigError, match="start with"):
        await leases.acquire(key, ttl=5)


@pytest.mark.parametrize("key", ["tenant{1}", "a}b", "{"])
async def test_other_braces_in_a_job_key_are_fine(leases: RedisLeases, key: str) -> None:
    """The hash tag ends at the first ``}``: both keys of the job still share it."""
    lease = await leases.acquire(key, ttl=5)
    assert lease is not None
    assert await leases.release(lease) is True


@pytest.mark.parametrize(
    ("seconds", "px"), [(1.0004, "1001"), (0.3, "300"), (2.5, "2500"), (0.0005, "1")]
)
def test_px_is_never_shorter_than_the_ttl_pure_unit(seconds: float, px: str) -> None:
    """The key's TTL in Redis is rounded up, never down (the local deadline uses ``seconds``).

    Pure unit test of the conversion (no Redis). 1.0004 s used to be sent as
    1000 ms: with drift and margin 0, the key could expire before the local deadline.
    """
    assert _ms(seconds) == px
