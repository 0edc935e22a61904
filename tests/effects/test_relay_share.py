"""The relay's share of a PostgreSQL store's pool: it never holds more, the jobs keep the rest.

A relay's round holds a pooled connection from its claim to its mark (the
claim's transaction); with three rounds in flight and their marks beside
them it held up to six of a pod's ten, and the jobs' transactions waited for
the pool while a backlog drained. Here a real PostgreSQL, the relay's claim
sessions counted in ``pg_stat_activity`` by their ``application_name``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence

import anyio
import psycopg
import pytest
from psycopg.rows import TupleRow

from leaseworker import CompletionRequest, ConfigError, open_store
from leaseworker._store import EffectStore, Message, OutboxRow, effect_store
from leaseworker._store._postgres import PostgresStore
from leaseworker.effects import Relay

from ..waiting import eventually

CLAIMS = (
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND application_name = 'leaseworker-relay-claim'"
)


async def commit(store: EffectStore, key: str) -> None:
    """Commit one execution of ``key`` with one message."""
    async with store.transaction(key, "v1", 1) as tx:
        request = CompletionRequest(
            job_key=key, input_version="v1", fence=1, result=None, execution_id=key, pod="p"
        )
        await tx.commit(request, [Message.build("effects", b"m")])


class Gate:
    """A sender whose sends wait until ``opened`` is set, then acknowledge every row."""

    def __init__(self) -> None:
        self.entered = 0  # sends begun
        self.opened = anyio.Event()
        self.acked = 0

    async def send_batch(self, rows: Sequence[OutboxRow]) -> list[tuple[int, int] | Exception]:
        """Wait for the gate; acknowledge ``rows``."""
        self.entered += 1
        await self.opened.wait()
        self.acked += len(rows)
        return [(0, self.acked - n) for n in range(len(rows))]


@pytest.fixture
def pg_url(store_url_for: Callable[[str], str]) -> str:
    """An empty PostgreSQL database of the test's own."""
    return store_url_for("postgresql")


@pytest.fixture
async def watcher(pg_url: str) -> AsyncIterator[psycopg.AsyncConnection[TupleRow]]:
    """A connection of the test's own (not the store's pool) that reads pg_stat_activity."""
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        yield conn


async def claim_sessions(conn: psycopg.AsyncConnection[TupleRow]) -> int:
    """How many sessions of the database hold a relay's claim now."""
    row = await (await conn.execute(CLAIMS)).fetchone()
    assert row is not None  # an aggregate: one row
    return int(row[0])


async def test_the_relay_holds_at_most_its_share_while_a_backlog_drains_and_jobs_get_the_rest(
    pg_url: str, watcher: psycopg.AsyncConnection[TupleRow]
) -> None:
    """Pool of 4, relay's share 2, three rounds in flight: the third claim waits for the share.

    (So does the relay's first prune, if it came after the second claim.)

    While two rounds hold their claims (their sends held), two jobs'
    transactions open at once on the two connections left (with the relay
    taking three, the second waited out the store's timeout). Then the
    backlog drains, sampled all along: never more than two claim sessions.
    """
    async with open_store(pg_url, max_connections=4, relay_connections=2) as opened:
        assert isinstance(opened, PostgresStore)
        store = effect_store(opened)
        for n in range(40):
            await commit(store, f"k{n}")
        gate = Gate()
        relay = Relay(store, gate, name="relay-a", batch=4, in_flight=3, linger=0)
        stop = anyio.Event()
        most = 0

        async def sample() -> None:
            nonlocal most
            while not stop.is_set():
                most = max(most, await claim_sessions(watcher))
                await anyio.sleep(0.002)

        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.run, stop)

            async def third_claim_waits() -> bool:
                return gate.entered == 2 and opened._claims.waiting >= 1

            await eventually(third_claim_waits, within=10)
            assert await claim_sessions(watcher) == 2
            async with (
                store.transaction("job-1", "v1", 1) as one,
                store.transaction("job-2", "v1", 1) as two,
            ):
                assert one.opened.status == two.opened.status == "claimed"
            tg.start_soon(sample)
            gate.opened.set()

            async def drained() -> bool:
                return relay.sent == 40

            await eventually(drained, within=20)
            stop.set()
        assert 1 <= most <= 2
        assert all(sent for _, sent in await store.outbox())


async def test_without_a_relay_share_given_the_relay_takes_two_fifths_of_the_pool(
    pg_url: str,
) -> None:
    """The default share: 4 of the pod's 10 connections, 1 of a pool of 2; out of range refused."""
    async with open_store(pg_url) as ten, open_store(pg_url, max_connections=2) as two:
        assert isinstance(ten, PostgresStore)
        assert isinstance(two, PostgresStore)
        assert (ten._claims.share, two._claims.share) == (4, 1)
    for share in (0, 11):
        with pytest.raises(ConfigError, match=rf"relay_connections must be between .*got {share}"):
            async with open_store(pg_url, relay_connections=share):
                pass


async def test_a_prune_waits_for_the_relays_share(pg_url: str) -> None:
    """With the share held by a claim, the relay's prune waits; it runs once the claim ends."""
    async with open_store(pg_url, relay_connections=1) as opened:
        assert isinstance(opened, PostgresStore)
        store = effect_store(opened)
        await commit(store, "k1")
        [row] = await store.claim_outbox("relay-a/0", limit=10, hold=30)
        pruned: list[int] = []

        async def prune() -> None:
            pruned.append(await store.prune_outbox(0.0))

        async with anyio.create_task_group() as tg:
            tg.start_soon(prune)

            async def waits() -> bool:
                return opened._claims.waiting == 1

            await eventually(waits)
            assert pruned == []
            assert await store.mark_sent("relay-a/0", [row.id]) == 1
        assert pruned == [1]
