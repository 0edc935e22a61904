"""RedisLeases specifics against a real redis-server: key names, scripts, PX rounding, settings.

What every lease store must do (owner tokens, fences, deadlines, faults) is in
``test_lease_conformance.py``, which runs on RedisLeases and MemoryLeases alike.
"""

from __future__ import annotations

import anyio
import pytest
from redis.asyncio import Redis

from leaseworker import ConfigError, RedisLeases
from leaseworker._lease import ttl_ms

from ..waiting import eventually


async def _absent(redis: Redis, key: str) -> bool:
    return not await redis.exists(key)


async def test_acquire_sets_owner_ttl_and_conservative_local_deadline(
    leases: RedisLeases, redis: Redis
) -> None:
    """The deadline is computed from the send time, shortened by drift and margin."""
    before = anyio.current_time()
    lease = await leases.acquire("report:acme:2026-11", lease_duration=2.0)
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
    first = await leases.acquire("k", lease_duration=5, note="one")
    assert first is not None
    assert first.previous is None
    assert await leases.release(first)
    second = await leases.acquire("k", lease_duration=0.05, note="two")
    assert second is not None
    assert second.previous == "one"
    await eventually(lambda: _absent(redis, leases.lease_key("k")))  # expired, not released
    third = await leases.acquire("k", lease_duration=5)
    assert third is not None
    assert third.previous == "two"
    assert await leases.release(third)
    fourth = await leases.acquire("k", lease_duration=5, note="four")
    assert fourth is not None
    assert fourth.previous is None  # the third left none: no older note stands in for it
    assert await redis.get(leases.fence_key("k")) == f"{fourth.fence} four".encode()


async def test_an_acquisition_writes_the_lease_and_fence_keys_only(
    leases: RedisLeases, redis: Redis
) -> None:
    """The note shares the fence key's value: a noted acquisition leaves two keys, no third.

    A note with spaces and colons (a trace reference) comes back whole.
    """
    note = "4bf92f:00f067:exec one"
    first = await leases.acquire("k", lease_duration=5, note=note)
    assert first is not None
    assert sorted(await redis.keys(f"{leases.namespace}:*")) == sorted(
        [leases.lease_key("k").encode(), leases.fence_key("k").encode()]
    )
    assert await leases.release(first)
    second = await leases.acquire("k", lease_duration=5)
    assert second is not None
    assert second.previous == note
    assert await redis.get(leases.fence_key("k")) == str(second.fence).encode()


async def test_fence_keys_written_before_notes_moved_are_read_as_fences(
    leases: RedisLeases, redis: Redis
) -> None:
    """Rolling upgrade: a bare-integer fence key (and a left-over note key) from the old script.

    The old acquire script kept the fence as a bare integer and the note in a
    third key. Its fence is read as the last fence (here one decades above the
    server's time, so ``last + 1`` wins over the time floor), by ``inspect`` too;
    the old note key is ignored (no predecessor rather than a wrong one) and
    left untouched.
    """
    old = 4 * 10**15
    await redis.set(leases.fence_key("k"), str(old))
    await redis.set(f"{leases.namespace}:{{k}}:note", "old-note")
    assert (await leases.inspect("k")).fence == old
    lease = await leases.acquire("k", lease_duration=5, note="new")
    assert lease is not None
    assert (lease.fence, lease.previous) == (old + 1, None)
    assert (await leases.inspect("k")).fence == old + 1
    assert await redis.get(f"{leases.namespace}:{{k}}:note") == b"old-note"


async def test_a_fence_not_below_the_time_floor_still_rises_and_keeps_its_note(
    leases: RedisLeases, redis: Redis
) -> None:
    """When the last fence is at or above the server's time, the script sets ``last + 1``.

    The script first stores the time floor; this is the path where it must
    store once more (two acquisitions in one microsecond, a server clock that
    went back). The predecessor's note comes back and the new note is kept.
    """
    ahead = 4 * 10**15
    await redis.set(leases.fence_key("k"), f"{ahead} before")
    lease = await leases.acquire("k", lease_duration=5, note="after")
    assert lease is not None
    assert (lease.fence, lease.previous) == (ahead + 1, "before")
    assert await redis.get(leases.fence_key("k")) == f"{ahead + 1} after".encode()


async def test_renew_extends_ttl_and_deadline(leases: RedisLeases, redis: Redis) -> None:
    """A confirmed renewal moves the deadline forward from its own send time."""
    lease = await leases.acquire("k", lease_duration=1.0)
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
        lease = await leases.acquire(key, lease_duration=5)
        assert lease is not None
        await leases.renew(lease)
        await leases.release(lease)
    info = await redis.info("memory")
    assert info["number_of_cached_scripts"] == 3  # a key spliced into the text would add more


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


@pytest.mark.parametrize(
    ("seconds", "px"), [(1.0004, "1001"), (0.3, "300"), (2.5, "2500"), (0.0005, "1")]
)
def test_px_is_never_shorter_than_the_ttl_pure_unit(seconds: float, px: str) -> None:
    """The key's TTL in Redis is rounded up, never down (the local deadline uses ``seconds``).

    Pure unit test of the conversion (no Redis). 1.0004 s used to be sent as
    1000 ms: with drift and margin 0, the key could expire before the local deadline.
    """
    assert ttl_ms(seconds) == px
