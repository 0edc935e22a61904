"""A step of the Redis host's wall clock, played on a real redis-server (issue 47, item 3).

Redis expires a key at an absolute unix-ms time read from its wall clock, also
for ``PEXPIRE``; a holder counts its lease on its own monotonic clock. A
forward step on the Redis host therefore expires a lease early, while its
holder still owns it by its own count: a second holder acquires and the two
run together until the first one's next renewal is rejected. A backward step
keeps a key past its TTL: a takeover after a holder died waits longer.

The server runs on a :class:`WallClock` (an ``LD_PRELOAD`` shim) that the test
steps while it runs; the monotonic clocks, the test's and Redis's, are not
touched. The overlap is measured on the test's event-loop clock, from the
second holder's acquire to the moment the first one's body stopped; the
step comes right after a confirmed renewal, the worst moment (the next one
is a whole renewal interval away).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
from redis.asyncio import Redis

from leaseworker import (
    CompletionRequest,
    CompletionResult,
    CompletionStore,
    Event,
    LeaseEvent,
    LeaseLost,
    RedisLeases,
    hold,
)
from leaseworker_dev._services import LocalRedis, WallClock

LEASE = 3.0
RENEWAL = 1.0
STEP = 5.0
ROUND_TRIP_SLACK = 0.5
"""What the rejected renewal's round trip and the body's stop may add on a loaded machine."""


@pytest.fixture
def clock(tmp_path: Path) -> WallClock:
    """A wall clock for the test's redis-server, not shifted yet."""
    return WallClock.create(tmp_path)


@pytest.fixture
def stepped_redis(clock: WallClock, tmp_path: Path) -> Iterator[LocalRedis]:
    """A redis-server of this test's own, on ``clock``."""
    server = LocalRedis.start(workdir=tmp_path / "redis", clock=clock)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def stepped_leases(stepped_redis: LocalRedis) -> AsyncIterator[RedisLeases]:
    """Leases on the stepped server, each call given 1.5 s (1 s renewals of a 3 s lease fit)."""
    client = Redis.from_url(stepped_redis.url)
    try:
        yield RedisLeases(client, namespace=f"t{uuid.uuid4().hex[:12]}", command_timeout=1.5)
    finally:
        await client.aclose()


class _Renewals:
    """A hook that sets a fresh event at every confirmed renewal."""

    def __init__(self) -> None:
        self.renewed = anyio.Event()

    def __call__(self, event: Event) -> None:
        assert isinstance(event, LeaseEvent)
        if event.name == "renewed":
            self.renewed.set()
            self.renewed = anyio.Event()


def _request(fence: int, execution: str) -> CompletionRequest:
    return CompletionRequest(
        job_key="k",
        input_version="v1",
        fence=fence,
        result={"by": execution},
        execution_id=execution,
        pod=execution,
    )


async def test_a_forward_step_overlaps_holders_for_one_renewal_and_the_fence_refuses_the_first(
    clock: WallClock, stepped_leases: RedisLeases, store: CompletionStore
) -> None:
    """+5 s on a 3 s lease renewed every 1 s: a second holder acquires at once, the first runs on.

    The second holder claims its higher fence in the store; the first one's
    completion, sent while it still believes it owns the lease, is ``stale``.
    The first body stops at its next renewal, rejected: the overlap is at most
    the renewal interval plus that renewal's round trip.
    """
    renewals = _Renewals()
    started, second_claimed = anyio.Event(), anyio.Event()
    first_fence = 0
    late: CompletionResult | None = None
    stopped_at = 0.0
    lost: LeaseLost | None = None

    async def first() -> None:
        nonlocal first_fence, late, stopped_at, lost
        try:
            async with hold(
                stepped_leases,
                "k",
                lease_duration=LEASE,
                renewal_interval=RENEWAL,
                hooks=[renewals],
            ) as held:
                first_fence = held.fence
                started.set()
                try:
                    await second_claimed.wait()
                    late = await store.complete(_request(held.fence, "first"))
                    await anyio.sleep_forever()
                finally:
                    stopped_at = anyio.current_time()
        except LeaseLost as exc:
            lost = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await started.wait()
        renewed = renewals.renewed
        await renewed.wait()  # the worst moment: a whole interval before the next renewal
        clock.step(STEP)
        second = await stepped_leases.acquire("k", lease_duration=LEASE)
        acquired_at = anyio.current_time()
        assert second is not None, "the forward step did not expire the first holder's lease"
        assert stopped_at == 0.0, "the first holder stopped before the second acquired"
        claim = await store.claim("k", "v1", second.fence)
        assert claim.status == "claimed"
        second_claimed.set()
    assert second is not None  # for mypy: the narrowing inside the task group is lost here
    overlap = stopped_at - acquired_at
    print(f"forward step +{STEP:.0f} s: overlap {overlap:.3f} s")  # the figure docs/leases quotes

    assert lost is not None
    assert lost.reason == "rejected"
    assert second.fence > first_fence
    assert late is not None
    assert (late.status, late.winning_fence) == ("stale", second.fence)
    assert 0 < overlap <= RENEWAL + ROUND_TRIP_SLACK
    done = await store.complete(_request(second.fence, "second"))
    assert done.status == "accepted"
    await stepped_leases.release(second)


async def test_a_backward_step_keeps_a_dead_holders_lease_longer_and_fences_still_rise(
    clock: WallClock, stepped_leases: RedisLeases
) -> None:
    """-5 s after a 3 s acquire whose holder dies: the takeover comes about 8 s after it, not 3.

    No overlap: the holder's deadline is on its own monotonic clock (at most
    3 s after it sent the acquire), long past when the key is taken over. The
    next fence is still higher, although it is floored at Redis's clock, now
    5 s behind: the counter stands above it.
    """
    dead = await stepped_leases.acquire("k", lease_duration=LEASE)
    assert dead is not None
    clock.step(-STEP)
    while (rival := await stepped_leases.acquire("k", lease_duration=LEASE)) is None:  # noqa: ASYNC110
        await anyio.sleep(0.02)  # a rival pod polls, as a real one would
    taken_over = anyio.current_time() - dead.sent_at
    print(f"backward step -{STEP:.0f} s: takeover {taken_over:.3f} s after a {LEASE:.0f} s lease")

    assert LEASE + STEP - 0.1 <= taken_over <= LEASE + STEP + ROUND_TRIP_SLACK
    assert dead.local_deadline <= dead.sent_at + LEASE < anyio.current_time()
    assert rival.fence > dead.fence
    await stepped_leases.release(rival)
