"""PostgreSQL batches: calls that wait together share one ``leaseworker_calls()`` trip.

Against the real server: concurrent lookups, claims and completions of many
job keys are answered as each would be alone, in fewer round trips than
calls, and two stores (two pods) batching the same job keys in opposite
orders never deadlock, because every batch locks head rows in job key order.
"""

from __future__ import annotations

import uuid

import anyio
import pytest

from leaseworker import CompletionRequest, open_store
from leaseworker._store import Call
from leaseworker._store._postgres import PostgresStore
from leaseworker_dev._services import LocalPostgres

KEYS = 24


@pytest.fixture
def pg_url(postgres_server: LocalPostgres) -> str:
    """A fresh database of this test's own on the session cluster."""
    return postgres_server.create_database(f"t{uuid.uuid4().hex[:12]}")


def request(key: str, version: str, fence: int) -> CompletionRequest:
    """A completion of ``key`` with a small result."""
    return CompletionRequest(
        job_key=key,
        input_version=version,
        fence=fence,
        result={"k": key},
        execution_id="e",
        pod="p",
    )


async def test_concurrent_calls_share_round_trips_and_get_their_own_answers(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """24 job keys, each looked up, claimed and completed at once: fewer trips than calls.

    Every answer is the one the call would get alone: nothing found, then
    ``claimed`` at its fence, then ``accepted`` with its own result; a
    completion below a key's claim in the same wave is ``stale``.
    """
    sizes: list[int] = []
    run_batch = PostgresStore._run_batch

    async def counted(self: PostgresStore, batch: list[Call[object]]) -> None:
        sizes.append(len(batch))
        await run_batch(self, batch)

    monkeypatch.setattr(PostgresStore, "_run_batch", counted)
    keys = [f"report:{n:02d}" for n in range(KEYS)]
    async with open_store(pg_url, call_timeout=5.0) as store:
        found: dict[str, object] = {}
        claimed: dict[str, tuple[str, int]] = {}
        accepted: dict[str, tuple[str, object]] = {}

        async def one(key: str, fence: int) -> None:
            found[key] = await store.lookup(key, "v1")
            claim = await store.claim(key, "v1", fence)
            claimed[key] = (claim.status, claim.highest_fence)
            answer = await store.complete(request(key, "v1", fence))
            accepted[key] = (answer.status, answer.result)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for n, key in enumerate(keys):
                    tg.start_soon(one, key, 100 + n)
        stale = await store.complete(request(keys[0], "v0", 50))
    assert found == dict.fromkeys(keys)
    assert claimed == {key: ("claimed", 100 + n) for n, key in enumerate(keys)}
    assert accepted == {key: ("accepted", {"k": key}) for key in keys}
    assert stale.status == "stale"
    assert sum(sizes) == 3 * KEYS + 1
    assert len(sizes) < 3 * KEYS  # calls that waited together shared a trip


async def test_two_stores_batching_the_same_keys_in_opposite_orders_never_deadlock(
    pg_url: str,
) -> None:
    """Two pods claim and complete the same 24 keys at once, one in reverse order.

    Each batch locks the head rows of its keys; locked in arrival order, the
    two would wait for each other (PostgreSQL aborts one with a deadlock
    error, a StoreUnavailable here). Locked in job key order, every call
    answers, and each key ends with the higher fence's completion.
    """
    keys = [f"report:{n:02d}" for n in range(KEYS)]
    async with open_store(pg_url, call_timeout=5.0) as first, open_store(pg_url) as second:
        statuses: list[str] = []

        async def wave(store: object, order: list[str], fence: int) -> None:
            assert isinstance(store, PostgresStore)
            async with anyio.create_task_group() as tg:
                for key in order:
                    tg.start_soon(claim_then_complete, store, key, fence)

        async def claim_then_complete(store: PostgresStore, key: str, fence: int) -> None:
            statuses.append((await store.claim(key, f"v{fence}", fence)).status)
            statuses.append((await store.complete(request(key, f"v{fence}", fence))).status)

        with anyio.fail_after(20):
            for attempt in range(3):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(wave, first, keys, 10 + 2 * attempt)
                    tg.start_soon(wave, second, keys[::-1], 11 + 2 * attempt)
        states = [await first.state(key) for key in keys]
    assert len(statuses) == 3 * 2 * 2 * KEYS
    assert set(statuses) <= {"claimed", "accepted", "stale"}
    assert all(state is not None and state.fence == 15 for state in states)
