"""Auto-pipelined lease calls against a real redis-server (and a ChaosProxy for faults).

What a test can see from outside: how many connections the client opened
(``CLIENT LIST``, by client name), which keys Redis holds, and what each call
answered. A call is sent alone when nothing is in flight (after one loop pass
once calls came together); calls made while one is in flight share one
pipeline, so N concurrent calls need one connection and two round trips, where
lone calls need N connections.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import anyio
import pytest
from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from leaseworker import Lease, LeaseUnavailable, RedisLeases
from leaseworker._lease._deadlines import DeadlineWheel
from leaseworker._lease._pipelining import ScriptPipeline
from leaseworker._lease._scripts import ACQUIRE, RENEW
from leaseworker._lease._trips import Replied
from leaseworker.testing import ChaosProxy
from leaseworker_dev._services import LocalRedis

from ..waiting import eventually


async def _connections(redis: Redis, name: str) -> int:
    clients = await redis.client_list()
    return sum(1 for client in clients if client.get("name") == name)


async def _connect(client: Redis) -> None:
    """Open a pooled connection (and load the script) outside any call's budget.

    A call on a new connection also pays for the connect and redis-py's
    handshake, through the proxy: a loaded machine can spend a 0.2 s budget
    on those before the command itself is sent.
    """
    with anyio.fail_after(30):
        await client.ping()
        await client.script_load(ACQUIRE)


async def _acquire_all(leases: RedisLeases, keys: list[str]) -> dict[str, Lease | None]:
    got: dict[str, Lease | None] = {}

    async with anyio.create_task_group() as tg:
        for key in keys:
            tg.start_soon(_acquire_into, leases, key, got)
    return got


@pytest.mark.parametrize("pipelining", [True, False], ids=["pipelined", "lone"])
async def test_concurrent_calls_share_a_pipeline_and_each_gets_its_own_answer(
    redis_server: LocalRedis, redis: Redis, namespace: str, pipelining: bool
) -> None:
    """21 concurrent acquires over a slow link: one goes alone, 20 share the next trip.

    Each answer is its own: every key gets the owner and fence Redis holds for
    it. Pipelined, the calls use one connection and two round trips (sent one
    by one they would take 21 trips of 0.1 s); sent alone, each takes a
    connection of its own (the control: it shows the count can tell).
    """
    name = f"pipe-{uuid.uuid4().hex[:8]}"
    async with ChaosProxy(redis_server.port) as proxy:
        client = Redis(host="127.0.0.1", port=proxy.port, client_name=name)
        try:
            leases = RedisLeases(
                client, namespace=namespace, command_timeout=1.5, pipelining=pipelining
            )
            proxy.reply_delay = 0.1
            keys = [f"k{i}" for i in range(21)]
            began = anyio.current_time()
            got = await _acquire_all(leases, keys)
            elapsed = anyio.current_time() - began
            proxy.reply_delay = 0.0
            for key in keys:
                lease = got[key]
                assert lease is not None
                # Each answer is its own key's: the fence and owner Redis holds for that key.
                assert await redis.get(leases.fence_key(key)) == str(lease.fence).encode()
                assert await redis.get(leases.lease_key(key)) == lease.owner.encode()
            assert await _connections(redis, name) == (1 if pipelining else 21)
            assert elapsed < 1.6  # two trips (or 21 side by side), not 21 in a row (2.1 s)
            assert all([await leases.release(lease) for lease in got.values() if lease])
        finally:
            await client.aclose()


async def test_scripts_flushed_while_calls_queue_are_loaded_again_for_their_pipeline(
    redis_server: LocalRedis, redis: Redis, namespace: str
) -> None:
    """SCRIPT FLUSH (a restarted Redis) between queueing and sending: every call still answers.

    A lone acquire is held in flight (Redis ran it; its reply is slow), ten
    more queue behind it, and then Redis forgets its scripts: the pipeline's
    calls are answered NOSCRIPT, the script is loaded, and they are sent again.
    """
    async with ChaosProxy(redis_server.port) as proxy:
        client = Redis(host="127.0.0.1", port=proxy.port, retry=Retry(NoBackoff(), 0))
        try:
            leases = RedisLeases(client, namespace=namespace, command_timeout=2.0)
            await leases.acquire("connect", lease_duration=5)
            proxy.reply_delay = 0.3
            async with anyio.create_task_group() as tg:
                tg.start_soon(leases.acquire, "first", 5.0)
                await eventually(lambda: _exists(redis, leases.fence_key("first")))
                got: dict[str, Lease | None] = {}
                for i in range(10):
                    tg.start_soon(_acquire_into, leases, f"k{i}", got)
                await anyio.wait_all_tasks_blocked()  # all ten wait behind "first"
                await redis.script_flush()
            proxy.reply_delay = 0.0
        finally:
            await client.aclose()
    assert len(got) == 10
    assert all(lease is not None for lease in got.values())
    assert await redis.script_exists(_sha(ACQUIRE)) == [True]


async def test_a_connection_loads_the_scripts_in_its_first_trip_and_after_a_reconnect(
    redis_server: LocalRedis, redis: Redis, namespace: str
) -> None:
    """The scripts go in front of a connection's first trip only: never NOSCRIPT, no load per call.

    A connection killed by the server comes back through its retry, whose
    trip loads them again (the server could be a restarted one).
    """
    name = f"pipelined-{uuid.uuid4().hex[:8]}"
    client = Redis.from_url(redis_server.url, client_name=name, retry=Retry(NoBackoff(), 1))
    leases = RedisLeases(client, namespace=namespace, command_timeout=2.0)
    try:
        loads = await _script_loads(redis)
        for i in range(5):
            lease = await leases.acquire(f"k{i}", lease_duration=5)
            assert lease is not None
            assert await leases.release(await leases.renew(lease))
        assert await _script_loads(redis) == loads + 3  # acquire, renew, release: once each
        [own] = [c for c in await redis.client_list() if c["name"] == name]
        assert await redis.client_kill_filter(_id=own["id"]) == 1
        assert await leases.acquire("again", lease_duration=5) is not None
        assert await _script_loads(redis) == loads + 6
    finally:
        await leases.aclose()
        await client.aclose()


async def _script_loads(redis: Redis) -> int:
    """How many ``SCRIPT LOAD`` commands the server has run (``INFO commandstats``)."""
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_script|load", {}).get("calls", 0))


async def _exists(redis: Redis, key: str) -> bool:
    return bool(await redis.exists(key))


async def _acquire_into(leases: RedisLeases, key: str, got: dict[str, Lease | None]) -> None:
    got[key] = await leases.acquire(key, lease_duration=5)


def _sha(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()


async def test_a_call_cancelled_while_queued_never_reaches_redis(
    redis_server: LocalRedis, redis: Redis, namespace: str
) -> None:
    """A caller that gives up before its pipeline is sent is left out of it.

    The first acquire is held in flight by a slow link; a second one queues
    behind it and is cancelled there. Redis never runs it: its job key never
    got a fence.
    """
    async with ChaosProxy(redis_server.port) as proxy:
        client = Redis(host="127.0.0.1", port=proxy.port, retry=Retry(NoBackoff(), 0))
        try:
            leases = RedisLeases(client, namespace=namespace, command_timeout=2.0)
            await leases.acquire(
                "connect", lease_duration=5
            )  # the connection exists before the delay
            proxy.reply_delay = 0.3
            async with anyio.create_task_group() as tg:
                tg.start_soon(leases.acquire, "first", 5.0)
                await anyio.wait_all_tasks_blocked()  # "first" is in flight
                queued = anyio.CancelScope()
                tg.start_soon(_in_scope, queued, leases.acquire, "second")
                await anyio.wait_all_tasks_blocked()  # "second" waits behind it
                queued.cancel()
            proxy.reply_delay = 0.0
            # A barrier: a call sent after any batch that could hold "second". Replies
            # come in order on the connection, so once it is answered, "second" would
            # have run in Redis already if it had been sent.
            await leases.acquire("barrier", 5.0)
        finally:
            await client.aclose()
    assert await redis.exists(leases.fence_key("first")) == 1
    assert await redis.exists(leases.fence_key("barrier")) == 1
    assert await redis.exists(leases.fence_key("second")) == 0


async def _in_scope(scope: anyio.CancelScope, acquire: object, key: str) -> None:
    with scope:
        await acquire(key, 5.0)  # type: ignore[operator]


async def test_a_partition_fails_the_lone_call_and_the_queued_ones_then_recovers(
    redis_server: LocalRedis, namespace: str
) -> None:
    """Redis unreachable: every call, sent or queued, fails within its timeout; then all works.

    A pipeline that never got an answer must not leave later calls queued
    behind it forever.
    """
    async with ChaosProxy(redis_server.port) as proxy:
        client = Redis(host="127.0.0.1", port=proxy.port, retry=Retry(NoBackoff(), 0))
        try:
            leases = RedisLeases(client, namespace=namespace, command_timeout=0.2)
            await _connect(client)
            await leases.acquire("connect", lease_duration=5)
            proxy.blackhole = True
            failures: list[BaseException] = []

            async def one(key: str) -> None:
                try:
                    await leases.acquire(key, lease_duration=5)
                except LeaseUnavailable as exc:
                    failures.append(exc)

            with anyio.fail_after(2):  # each call is bounded by 0.2 s
                async with anyio.create_task_group() as tg:
                    for i in range(6):
                        tg.start_soon(one, f"k{i}")
            assert len(failures) == 6
            proxy.blackhole = False
            await _connect(client)  # the timed-out calls dropped their connection
            with anyio.fail_after(2):
                got = await _acquire_all(leases, [f"after{i}" for i in range(6)])
            assert all(lease is not None for lease in got.values())
        finally:
            await client.aclose()


async def test_a_pipeline_whose_callers_all_gave_up_is_abandoned(
    redis_server: LocalRedis, redis: Redis, namespace: str
) -> None:
    """A stalled pipeline is dropped once its last caller stops waiting, not at its own timeout.

    The pipeline's own bound here is 5 s; its callers wait at most 0.2 and
    0.4 s. Once both gave up, a call made after the partition heals must
    not wait behind the stalled pipeline: it gets 2 s, well below those 5 s
    but room for its reconnect and handshake on a loaded machine.
    """
    sha = _sha(ACQUIRE)
    await redis.script_load(ACQUIRE)
    async with ChaosProxy(redis_server.port) as proxy:
        client = Redis(host="127.0.0.1", port=proxy.port, retry=Retry(NoBackoff(), 0))
        try:
            pipeline = ScriptPipeline(client, {sha: ACQUIRE}, DeadlineWheel(5.0))

            async def acquire(key: str, patience: float) -> object:
                with anyio.fail_after(patience):
                    return await pipeline.call(
                        sha,
                        [f"{namespace}:{key}", f"{namespace}:f", f"{namespace}:n"],
                        ["o", "5000", ""],
                    )

            await acquire("connect", 2.0)
            proxy.blackhole = True
            async with anyio.create_task_group() as tg:
                tg.start_soon(_times_out, acquire("lone", 0.2))
                await anyio.wait_all_tasks_blocked()  # sent alone, into the partition
                tg.start_soon(_times_out, acquire("queued", 0.4))  # sent after "lone" gives up
            proxy.blackhole = False
            reply = await acquire("after", 2.0)
            assert isinstance(reply, Replied)
            assert reply.value[0] == 1  # acquired
            assert reply.acked is None  # no replica acknowledgement was asked for
        finally:
            await client.aclose()


async def test_a_call_cut_off_mid_read_leaves_no_late_reply_for_the_next_one(
    redis_server: LocalRedis, redis: Redis, namespace: str
) -> None:
    """A reply that comes after its caller gave up is never read as the next call's answer.

    Lone calls share one kept connection: a cut-off read drops it (reopened by the next call).
    """
    acquire, renew = _sha(ACQUIRE), _sha(RENEW)
    await redis.script_load(ACQUIRE)
    await redis.script_load(RENEW)
    async with ChaosProxy(redis_server.port) as proxy:
        client = Redis(host="127.0.0.1", port=proxy.port, retry=Retry(NoBackoff(), 0))
        try:
            pipeline = ScriptPipeline(client, {acquire: ACQUIRE, renew: RENEW}, DeadlineWheel(5.0))
            keys = [f"{namespace}:late", f"{namespace}:f"]
            await pipeline.call(renew, [f"{namespace}:other"], ["o", "5000"])  # connected
            proxy.reply_delay = 0.3
            with pytest.raises(TimeoutError), anyio.fail_after(0.1):
                await pipeline.call(acquire, keys, ["o", "5000", ""])
            proxy.reply_delay = 0.0
            await anyio.sleep(0.4)  # the late reply has reached the client side by now
            with anyio.fail_after(2):
                reply = await pipeline.call(renew, [f"{namespace}:other"], ["o", "5000"])
            assert reply.value == 0  # its own answer (not ours), not the acquire's late list
        finally:
            await client.aclose()


async def _times_out(call: Awaitable[object]) -> None:
    with pytest.raises(TimeoutError):
        await call


class _CountingConnection(Connection):
    """Counts packed writes: one per round trip (a lone command or a whole pipeline)."""

    trips = 0

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        type(self).trips += 1
        await super().send_packed_command(command, check_health)


@pytest.fixture
async def counted(redis_server: LocalRedis) -> AsyncIterator[Redis]:
    """A client whose round trips are counted in ``_CountingConnection.trips``."""
    pool = ConnectionPool(port=redis_server.port, connection_class=_CountingConnection)
    client = Redis.from_pool(pool)
    try:
        yield client
    finally:
        await client.aclose()


async def test_renewals_made_while_nothing_is_in_flight_share_one_trip(
    counted: Redis, namespace: str
) -> None:
    """Three renewals made at once: the first lingers, so all three go in one pipeline.

    Without the linger the first would go alone and the other two in a second
    trip; acquires do not linger (two acquires made at once take two trips).
    """
    leases = RedisLeases(counted, namespace=namespace)
    held = [await leases.acquire(f"k{i}", lease_duration=5) for i in range(3)]
    await counted.script_load(RENEW)  # no NOSCRIPT round trips in the count
    before = _CountingConnection.trips
    async with anyio.create_task_group() as tg:
        for lease in held:
            assert lease is not None
            tg.start_soon(leases.renew, lease)
    assert _CountingConnection.trips - before == 1
    before = _CountingConnection.trips
    async with anyio.create_task_group() as tg:
        tg.start_soon(leases.acquire, "a", 5.0)
        tg.start_soon(leases.acquire, "b", 5.0)
    assert _CountingConnection.trips - before == 2


async def test_after_calls_came_together_the_next_idle_one_waits_a_loop_pass(
    counted: Redis, namespace: str
) -> None:
    """Calls that came together once: the next made while idle waits a pass and takes company.

    A poll's executions acquire in one loop pass: the first of the next cohort
    then shares the others' trip instead of going alone. A call that found
    nobody in that pass goes at once next time (sequential calls pay no pass).
    """
    leases = RedisLeases(counted, namespace=namespace)
    await counted.script_load(ACQUIRE)  # no NOSCRIPT round trips in the count

    async def trips(keys: list[str]) -> int:
        before = _CountingConnection.trips
        await _acquire_all(leases, keys)
        return _CountingConnection.trips - before

    assert await trips(["a1", "a2", "a3"]) == 2  # the first alone, the others queued behind it
    assert await trips(["b1", "b2", "b3"]) == 1  # the first waited a pass: one trip for all
    assert await trips(["c"]) == 1  # waited a pass, found nobody: alone
    assert await trips(["d1", "d2"]) == 2  # alone last time, so the first went at once


async def test_a_call_in_a_hurry_takes_the_lingering_ones_along_at_once(
    counted: Redis, namespace: str
) -> None:
    """A call without linger made during a linger sends it now: one trip, no waiting it out."""
    leases = RedisLeases(counted, namespace=namespace)
    lease = await leases.acquire("k", lease_duration=5)
    assert lease is not None
    sha, keys, args = _sha(RENEW), [leases.lease_key("k")], [lease.owner, "5000"]
    pipeline = ScriptPipeline(counted, {sha: RENEW}, DeadlineWheel(30.0))
    await counted.script_load(RENEW)
    answers: list[int] = []

    async def lingering() -> None:
        answers.append(int((await pipeline.call(sha, keys, args, linger=60)).value))

    before = _CountingConnection.trips
    with anyio.fail_after(10):  # far less than the 60 s linger
        async with anyio.create_task_group() as tg:
            tg.start_soon(lingering)
            await anyio.wait_all_tasks_blocked()
            answers.append(int((await pipeline.call(sha, keys, args)).value))
    assert answers == [1, 1]
    assert _CountingConnection.trips - before == 1
