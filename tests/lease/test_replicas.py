"""Replica-acknowledged leases: ``WAIT`` decides whether an acquire or renewal counts.

Real Redis: a master with one real replica (``REPLICAOF``), frozen with SIGSTOP
to hold replication back, and a master with no replica at all.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
from redis.asyncio import Redis

from leaseworker import (
    ConfigError,
    Event,
    LeaseEvent,
    LeaseLost,
    LeaseUnavailable,
    RedisLeases,
    hold,
)
from leaseworker_dev._services import LocalRedis


@pytest.fixture
def replica(redis_server: LocalRedis, tmp_path: Path) -> Iterator[LocalRedis]:
    """A second redis-server, made a replica of the session's server by the test."""
    server = LocalRedis.start(workdir=tmp_path)
    try:
        yield server
    finally:
        server.process.popen.send_signal(signal.SIGCONT)  # in case a test left it frozen
        server.stop()


@pytest.fixture
async def replicated(
    redis_server: LocalRedis, replica: LocalRedis, redis: Redis
) -> AsyncIterator[LocalRedis]:
    """The replica, attached and in sync; detached again afterwards."""
    client = Redis.from_url(replica.url)
    try:
        await redis.config_set("repl-diskless-sync-delay", 0)  # sync at once, not after 5 s
        await client.replicaof("127.0.0.1", redis_server.port)
        with anyio.fail_after(15):
            while not await _replica_online(redis):
                await _write_acknowledged(redis)  # paces the poll: WAIT blocks up to 100 ms
            while await _write_acknowledged(redis) < 1:  # a write the snapshot did not hold
                pass
        yield replica
    finally:
        replica.process.popen.send_signal(signal.SIGCONT)
        await client.replicaof("NO", "ONE")
        await client.aclose()


async def _replica_online(redis: Redis) -> bool:
    """Whether the master lists its replica as ``state=online`` (its full sync done).

    A write older than the sync's snapshot is acknowledged as soon as the
    replica loaded it, before writes stream to it: the ack check alone passed
    while the next write (the test's acquire) waited past its 500 ms ``WAIT``
    (about 1 run in 3). Only a write made after this answers yes proves the
    stream flows.
    """
    info = await redis.info("replication")
    replica = info.get("slave0")
    return isinstance(replica, dict) and replica.get("state") == "online"


async def _write_acknowledged(redis: Redis) -> int:
    """Write, then ``WAIT 1 100`` on the same connection: how many replicas have the write.

    Apart (two pooled connections), ``WAIT`` would count a replica still in its
    first sync, since the waiting connection wrote nothing.
    """
    async with redis.pipeline(transaction=False) as pipe:
        pipe.set("leaseworker-test:sync", "1")
        pipe.wait(1, 100)
        _, acknowledged = await pipe.execute()
    return int(acknowledged)


def test_replica_timeout_must_fit_in_the_command_timeout(redis: Redis) -> None:
    """The wait is part of every call's budget: one that cannot fit is refused."""
    with pytest.raises(ConfigError, match="replica_timeout"):
        RedisLeases(redis, replicas=1, command_timeout=0.5, replica_timeout=0.5)
    with pytest.raises(ConfigError, match="replicas"):
        RedisLeases(redis, replicas=-1)
    assert RedisLeases(redis).replicas == 0
    assert RedisLeases(redis, replicas=2).replicas == 2


@pytest.mark.parametrize("pipelining", [True, False], ids=["pipelined", "lone"])
async def test_an_acquire_no_replica_acknowledged_is_released_and_unavailable(
    redis: Redis, namespace: str, pipelining: bool
) -> None:
    """A master without replicas: the acquire is undone, the body never starts.

    The WAIT gives up after 0.1 s; the call around it has 3 s (at 0.5 s, a
    fresh connection's handshake and that WAIT on a loaded machine could run
    out, and the acquire failed as a timeout, not as unreplicated).
    """
    leases = RedisLeases(
        redis,
        namespace=namespace,
        command_timeout=3.0,
        replicas=1,
        replica_timeout=0.1,
        pipelining=pipelining,
    )
    started = False
    with pytest.raises(LeaseUnavailable, match="0 of 1 replicas"):
        async with hold(leases, "k", lease_duration=10):
            started = True
    assert not started
    assert (await leases.inspect("k")).owner is None  # released with its owner token


def _in_sync_leases(redis: Redis, namespace: str, pipelining: bool) -> RedisLeases:
    """Leases waiting for one in-sync replica: 1.5 s, which a loaded machine never runs past."""
    return RedisLeases(
        redis,
        namespace=namespace,
        command_timeout=2.0,
        replicas=1,
        replica_timeout=1.5,
        pipelining=pipelining,
    )


@pytest.mark.parametrize("pipelining", [True, False], ids=["pipelined", "lone"])
async def test_replicated_acquire_and_renewals_keep_the_body_running(
    replicated: LocalRedis, redis: Redis, namespace: str, pipelining: bool
) -> None:
    """With the replica in sync, every acquire and renewal counts."""
    leases = _in_sync_leases(redis, namespace, pipelining)
    three = anyio.Event()

    def observe(event: Event) -> None:
        assert isinstance(event, LeaseEvent)
        if event.name == "renewed" and held.renewals >= 3:
            three.set()

    async with hold(leases, "k", lease_duration=4.0, renewal_interval=0.2, hooks=[observe]) as held:
        with anyio.fail_after(5):
            await three.wait()
        await held.checkpoint()
    assert held.outcome == "completed"
    assert held.renewals >= 3


async def test_a_renewal_the_replica_did_not_get_stops_the_body_for_good(
    replicated: LocalRedis, redis: Redis, namespace: str
) -> None:
    """Replication held back (replica frozen): the next renewal loses the lease.

    The master alone still answers the renewal with success; only ``WAIT``
    says that a failover now could promote a replica with an older expiry.
    """
    leases = RedisLeases(
        # A loaded machine can take 100 ms to replicate: the wait is generous, and
        # the frozen replica answers it with 0 however long it is.
        redis,
        namespace=namespace,
        command_timeout=1.0,
        replicas=1,
        replica_timeout=0.5,
    )
    with pytest.raises(LeaseLost) as lost, anyio.fail_after(10):  # fails, never hangs
        async with hold(leases, "k", lease_duration=3.0, renewal_interval=0.5) as held:
            replicated.process.popen.send_signal(signal.SIGSTOP)
            await anyio.sleep_forever()
    assert lost.value.reason == "unreplicated"
    assert "0 of 1 replicas" in lost.value.detail
    assert held.outcome == "lost"
    assert held.renewals == 0


@pytest.mark.parametrize("pipelining", [True, False], ids=["pipelined", "lone"])
async def test_a_lone_release_sends_no_wait(
    replicated: LocalRedis, redis: Redis, namespace: str, pipelining: bool
) -> None:
    """The acquire waits for its replica; the release does not (a lost release costs no safety)."""
    leases = _in_sync_leases(redis, namespace, pipelining)
    before = await _waits(redis)
    lease = await leases.acquire("k", 5)
    assert lease is not None
    acquired = await _waits(redis)
    assert acquired == before + 1
    assert await leases.release(lease)
    assert await _waits(redis) == acquired
    assert await redis.exists(leases.lease_key("k")) == 0


async def _waits(redis: Redis) -> int:
    """How many ``WAIT`` commands the server has run (``INFO commandstats``)."""
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_wait", {}).get("calls", 0))


@pytest.mark.parametrize("pipelining", [True, False], ids=["pipelined", "lone"])
async def test_a_first_renewal_with_the_replica_frozen_waits_for_it_once(
    replicated: LocalRedis, redis: Redis, namespace: str, pipelining: bool
) -> None:
    """A server that never ran the renewal script: refused as unreplicated after one ``WAIT``.

    The acquire loaded only its own script. Had the renewal gone as
    ``EVALSHA`` + ``WAIT`` answered NOSCRIPT, its ``WAIT`` (the frozen
    replica never acknowledges) would block 1.5 s, and the call sent again
    after the load wait 1.5 s more: a timeout at 2 s instead.
    """
    await redis.script_flush()
    leases = _in_sync_leases(redis, namespace, pipelining)
    lease = await leases.acquire("k", 10)
    assert lease is not None
    before = await _waits(redis)
    replicated.process.popen.send_signal(signal.SIGSTOP)
    with pytest.raises(LeaseLost) as lost, anyio.fail_after(10):
        await leases.renew(lease)
    assert lost.value.reason == "unreplicated"
    assert await _waits(redis) == before + 1
    await leases.aclose()


@pytest.mark.parametrize("pipelining", [True, False], ids=["pipelined", "lone"])
async def test_a_renewal_after_a_script_flush_waits_within_the_replica_timeout(
    replicated: LocalRedis, redis: Redis, namespace: str, pipelining: bool
) -> None:
    """Scripts flushed under a live connection: NOSCRIPT, and the call again within what is left.

    The first ``WAIT`` is spent (1.5 s) on the refused script; the second
    gets what is left of the 1.5 s, so the renewal is refused as
    unreplicated, not timed out at the 2 s command timeout.
    """
    leases = _in_sync_leases(redis, namespace, pipelining)
    lease = await leases.acquire("k", 10)
    assert lease is not None
    lease = await leases.renew(lease)  # both scripts known held on the client's connection
    await redis.script_flush()
    before = await _waits(redis)
    replicated.process.popen.send_signal(signal.SIGSTOP)
    with pytest.raises(LeaseLost) as lost, anyio.fail_after(10):
        await leases.renew(lease)
    assert lost.value.reason == "unreplicated"
    assert await _waits(redis) == before + 2
    await leases.aclose()
