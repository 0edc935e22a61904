"""The relay's bell and its retention: woken by this process's commits, old sent rows pruned.

An idle relay waits up to its poll interval; a commit of its own process
rings its store's bell and the relay sends at once (the executor rings it
after a job's transaction committed messages). Sent rows older than the
retention are deleted, never an unsent one, on every durable backend.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from leaseworker import JobContext, ReportJob, open_store
from leaseworker._store import PRUNE_LIMIT, EffectStore, OutboxRow, effect_store
from leaseworker.effects import Relay
from leaseworker.testing import JobEnvironment, make_trigger

from .test_relay import Counting, FakeSender, commit


class Idle:
    """Forwards to ``inner``; ``idle`` is set once a claim found nothing (the relay goes idle).

    ``pruned`` is set once a prune deleted rows.
    """

    def __init__(self, inner: EffectStore) -> None:
        self.inner = inner
        self.idle = anyio.Event()
        self.pruned = anyio.Event()

    async def prune_outbox(self, older_than: float, *, limit: int = PRUNE_LIMIT) -> int:
        """Prune on the inner store; note a prune that deleted rows."""
        deleted = await self.inner.prune_outbox(older_than, limit=limit)
        if deleted:
            self.pruned.set()
        return deleted

    async def claim_outbox(self, relay: str, *, limit: int, hold: float) -> list[OutboxRow]:
        """Claim on the inner store; note an empty answer."""
        rows = await self.inner.claim_outbox(relay, limit=limit, hold=hold)
        if not rows:
            self.idle.set()
        return rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture
async def memory() -> AsyncIterator[EffectStore]:
    """An empty ``memory://`` store."""
    async with open_store("memory://") as opened:
        yield effect_store(opened)


async def test_a_ring_wakes_an_idle_relay_before_its_poll_interval(memory: EffectStore) -> None:
    """Polling every 60 s: the message is sent within 5 s only because the bell woke the relay."""
    store = Idle(memory)
    sender = Counting(FakeSender(), 1)
    relay = Relay(store, sender, name="relay-a", idle=60, idle_max=60)
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run, stop)
        with anyio.fail_after(5):
            await store.idle.wait()  # its first round found nothing: it waits now
            await commit(memory, "k1", 1, b"one")
            store.outbox_bell.ring()
            await sender.reached.wait()
            stop.set()  # the bell also wakes it for the stop: run returns at once
    assert relay.sent == 1


async def test_a_jobs_committed_messages_ring_the_bell_and_a_refused_run_does_not() -> None:
    """The executor rings its store's bell after a commit with messages, not for none."""

    class Publishes(ReportJob):
        topic = "reports.requested"

        async def run(self, ctx: JobContext) -> object:
            ctx.publish("reports.ready", {"n": 1})
            return None

    env = JobEnvironment(Publishes())
    bell = env._faulty.outbox_bell  # the store the executor completes on
    trigger = make_trigger({"jobId": "report:acme"})
    assert (await env.run(trigger)).outcome == "completed"
    assert bell.rings == 1
    assert (await env.run(trigger)).outcome == "duplicate"  # nothing new committed
    assert bell.rings == 1


async def test_prune_deletes_old_sent_rows_and_never_an_unsent_one(store_url: str) -> None:
    """Two of three rows sent: a zero retention deletes those two; a day's deletes nothing."""
    async with open_store(store_url) as opened:
        store = effect_store(opened)
        await commit(store, "k1", 1, b"one", b"two")
        await commit(store, "k2", 2, b"three")
        rows = await store.claim_outbox("relay-a", limit=10, hold=30)
        assert await store.mark_sent("relay-a", [rows[0].id, rows[2].id]) == 2
        assert await store.prune_outbox(86_400) == 0
        await anyio.sleep(0.01)  # the marks are now strictly older than "now"
        assert await store.prune_outbox(0) == 2
        left = await store.outbox()
        assert [(row.message.value, sent) for row, sent in left] == [(b"two", False)]


async def test_a_backlog_is_sent_before_the_relay_prunes(
    memory: EffectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prune that has not answered yet holds back neither the first round nor the next claim.

    The relay once pruned before its first claim, then between its first
    claim and the next: a slow prune delayed the backlog behind it (here,
    one row per round, the second round never came).
    """
    await commit(memory, "k1", 1, b"one")
    await commit(memory, "k2", 2, b"two")
    pruning, answer = anyio.Event(), anyio.Event()
    prune_outbox = memory.prune_outbox

    async def slow_prune(older_than: float, *, limit: int = PRUNE_LIMIT) -> int:
        pruning.set()
        await answer.wait()
        return await prune_outbox(older_than, limit=limit)

    monkeypatch.setattr(memory, "prune_outbox", slow_prune)
    sender = Counting(FakeSender(), 2)
    relay = Relay(memory, sender, name="relay-a", batch=1)
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run, stop)
        try:
            with anyio.fail_after(10):
                await sender.reached.wait()  # both sent while the prune still waits
            assert pruning.is_set()
        finally:
            answer.set()
            stop.set()
    assert relay.sent == 2


async def test_the_relay_prunes_what_it_sent_after_the_retention(store_url: str) -> None:
    """With a zero retention, checked every round, sent rows leave the table."""
    async with open_store(store_url) as opened:
        store = effect_store(opened)
        await commit(store, "k1", 1, b"one", b"two")
        sender = FakeSender()
        relay = Relay(store, sender, name="relay-a", retention=0, prune_every=0)
        assert await relay.relay_once() == (2, 0)
        await anyio.sleep(0.01)
        stop = anyio.Event()
        idle = Idle(store)
        relay = Relay(idle, sender, name="relay-a", retention=0, prune_every=0)
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.run, stop)
            with anyio.fail_after(5):
                await idle.idle.wait()  # its round found nothing to send
                await idle.pruned.wait()  # and pruned after its claim
            stop.set()
        assert relay.pruned == 2
        assert await store.outbox() == []
