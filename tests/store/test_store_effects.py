"""Jobs' transactions and the outbox, on every backend: the store side of docs/effects.md.

A transaction holds the job key's head lock, refuses (writes nothing) below
the highest fence seen, claims included, and commits the job's rows, its
messages and its completion together or not at all. The relays' claims keep
each job key's commit order and are taken over once expired. Tests that need
no table of the job's own run on all three backends (``any_store``).
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql as pgsql

from leaseworker import CompletionRequest, CompletionResult, open_store
from leaseworker._store import (
    MIGRATIONS,
    EffectStore,
    Message,
    effect_id,
    effect_store,
    migrate_store,
    parse_store_url,
)
from leaseworker._store._postgres import PostgresStore, _pg_claims, _pg_takeover

from ..waiting import eventually
from .test_store import now_fence, raw

KEY = "report:acme:2026-11"


@pytest.fixture(params=["postgresql", "sqlite", "memory"])
async def any_store(
    request: pytest.FixtureRequest, store_url_for: Callable[[str], str]
) -> AsyncIterator[EffectStore]:
    """An open store on each backend in turn, ``memory://`` included."""
    async with open_store(store_url_for(request.param)) as opened:
        yield effect_store(opened)


@pytest.fixture
async def sql_store(store_url: str) -> AsyncIterator[tuple[EffectStore, str]]:
    """A durable store with the job's own table ``report``, and its URL."""
    await raw(store_url, "CREATE TABLE report (k text PRIMARY KEY, fence bigint NOT NULL)")
    async with open_store(store_url) as opened:
        yield effect_store(opened), store_url


def request(fence: int, version: str = "v1", key: str = KEY) -> CompletionRequest:
    """A completion request naming its fence in its result."""
    return CompletionRequest(
        job_key=key,
        input_version=version,
        fence=fence,
        result={"fence": fence},
        execution_id=f"exec-{fence}",
        pod="pod-a",
    )


def insert(url: str) -> str:
    """The job's own insert, in its driver's placeholders."""
    sql = "INSERT INTO report (k, fence) VALUES (%s, %s)"
    return sql.replace("%s", "?") if url.startswith("sqlite") else sql


async def write(
    store: EffectStore,
    fence: int,
    *,
    url: str | None = None,
    version: str = "v1",
    messages: int = 1,
) -> CompletionResult | str:
    """Run one job transaction at ``fence``: a row (with ``url``), messages, the completion.

    Return the commit's answer, or the opening's status when it was refused.
    """
    async with store.transaction(KEY, version, fence) as tx:
        if tx.opened.status != "claimed":
            return str(tx.opened.status)
        if url is not None:
            await tx.execute(insert(url), (f"{version}-{fence}", fence))
        sent = [Message.build("reports.ready", {"fence": fence, "n": n}) for n in range(messages)]
        return await tx.commit(request(fence, version), sent)


async def test_rows_messages_and_completion_commit_together(
    sql_store: tuple[EffectStore, str],
) -> None:
    """One commit: the job's row, its two messages (in order) and the completion all appear."""
    store, url = sql_store
    answer = await write(store, 10, url=url, messages=2)
    assert isinstance(answer, CompletionResult)
    assert answer.status == "accepted"
    assert await raw(url, "SELECT k, fence FROM report") == [("v1-10", 10)]
    rows = await store.outbox(KEY)
    assert [(row.seq, row.fence, sent) for row, sent in rows] == [(0, 10, False), (1, 10, False)]
    assert rows[0][0].effect_id != rows[1][0].effect_id
    found = await store.lookup(KEY, "v1")
    assert found is not None
    assert found.fence == 10


async def test_a_failure_in_the_block_writes_nothing(sql_store: tuple[EffectStore, str]) -> None:
    """The job raises after its insert: no row, no message, no completion."""
    store, url = sql_store
    with pytest.raises(ZeroDivisionError):
        async with store.transaction(KEY, "v1", 10) as tx:
            await tx.execute(insert(url), ("v1-10", 10))
            raise ZeroDivisionError
    assert await raw(url, "SELECT count(*) FROM report") == [(0,)]
    assert await store.outbox() == []
    assert await store.lookup(KEY, "v1") is None


async def test_a_block_left_without_commit_rolls_back(sql_store: tuple[EffectStore, str]) -> None:
    """Leaving the block without ``commit`` (the job never completed) keeps nothing."""
    store, url = sql_store
    async with store.transaction(KEY, "v1", 10) as tx:
        await tx.execute(insert(url), ("v1-10", 10))
    assert await raw(url, "SELECT count(*) FROM report") == [(0,)]
    assert await store.claim(KEY, "v1", 10) is not None  # the key is free again


async def test_a_higher_claim_refuses_the_transaction_before_anything_is_written(
    any_store: EffectStore,
) -> None:
    """B claimed fence 20 and has not completed; A (fence 10) opens: ``stale``, nothing written."""
    await any_store.claim(KEY, "v2", 20)
    async with any_store.transaction(KEY, "v1", 10) as tx:
        assert (tx.opened.status, tx.opened.highest_fence) == ("stale", 20)
    assert await any_store.outbox() == []
    assert await any_store.lookup(KEY, "v1") is None
    answer = await write(any_store, 20, version="v2")
    assert isinstance(answer, CompletionResult)
    assert answer.status == "accepted"


async def test_a_completed_identity_is_refused_as_duplicate(any_store: EffectStore) -> None:
    """A redelivered identity opens ``duplicate`` with the earlier completion; nothing written."""
    assert isinstance(await write(any_store, 10), CompletionResult)
    async with any_store.transaction(KEY, "v1", 11) as tx:
        assert tx.opened.status == "duplicate"
        assert tx.opened.completion is not None
        assert tx.opened.completion.fence == 10
    assert len(await any_store.outbox()) == 1


async def test_a_claim_waits_for_the_open_transaction_then_sees_its_completion(
    any_store: EffectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newer claim arriving mid-transaction waits for the head lock; it then finds the completion.

    So the open transaction's fence check still holds when it commits: no
    newer execution can start between its check and its commit. (PostgreSQL:
    a newer claim that waits past ``LOOK_AFTER`` ends the older session
    instead, see test_store_postgres; here the look is put off.)
    """
    monkeypatch.setattr(_pg_takeover, "LOOK_AFTER", 30.0)
    claimed: list[str] = []
    answered = anyio.Event()
    async with anyio.create_task_group() as tg, any_store.transaction(KEY, "v1", 10) as tx:
        assert tx.opened.status == "claimed"

        async def claim() -> None:
            claimed.append((await any_store.claim(KEY, "v1", 20)).status)
            answered.set()

        tg.start_soon(claim)
        with anyio.move_on_after(0.3):  # the claim must not get through while the lock is held
            await answered.wait()
        assert claimed == []
        assert (await tx.commit(request(10), [])).status == "accepted"
    assert claimed == ["duplicate"]


async def test_fifty_concurrent_transactions_leave_only_the_highest_fence_writing(
    any_store: EffectStore,
) -> None:
    """50 executions racing, each claiming then writing a message: only unrefused ones commit.

    Every answer is a commit (``accepted``) or a refusal (``stale``); the
    highest fence commits; every committed fence was the highest seen when
    it committed (the committed fences rise in commit order), and the outbox
    holds exactly the committed executions' messages, in that order.
    """
    rng = random.Random(1729)
    base = now_fence()
    fences = rng.sample(range(base, base + 1_000_000), 50)
    gate = anyio.Event()
    answers: dict[int, str] = {}
    committed: list[int] = []

    async def execution(i: int, fence: int) -> None:
        await gate.wait()
        await any_store.claim(KEY, f"v{i}", fence)
        answer = await write(any_store, fence, version=f"v{i}")
        if isinstance(answer, CompletionResult):
            committed.append(fence)
            answers[i] = answer.status
        else:
            answers[i] = answer

    async with anyio.create_task_group() as tg:
        for i, fence in enumerate(fences):
            tg.start_soon(execution, i, fence)
        gate.set()
    assert set(answers.values()) <= {"accepted", "stale"}
    assert answers[fences.index(max(fences))] == "accepted"
    assert committed == sorted(committed)
    assert [row.fence for row, _ in await any_store.outbox(KEY)] == committed


async def test_relays_keep_each_keys_order_and_take_over_expired_claims(
    any_store: EffectStore,
) -> None:
    """Two relays: a key's later message is never claimed while an earlier one is held.

    Relay A holds key 1's first message; relay B gets key 2's messages but
    none of key 1's. Once A's claim expires, B takes key 1's messages over,
    in order; A cannot mark them sent after losing them. A's claim lasts 1 s
    (it lasted 0.3 s: a loaded machine stalling that long before B's first
    claim let B take key 1 early), and the test waits out exactly that.
    """
    for key, fence in (("k1", 1), ("k2", 2), ("k1", 3)):
        async with any_store.transaction(key, f"v{fence}", fence) as tx:
            message = Message.build("t", {"key": key, "fence": fence})
            await tx.commit(request(fence, f"v{fence}", key), [message])
    first = await any_store.claim_outbox("relay-a", limit=1, hold=1.0)
    expired = anyio.current_time() + 1.05  # A's claim was made before now
    assert [(row.job_key, row.fence) for row in first] == [("k1", 1)]
    second = await any_store.claim_outbox("relay-b", limit=10, hold=30)
    assert [(row.job_key, row.fence) for row in second] == [("k2", 2)]
    await anyio.sleep(max(0.0, expired - anyio.current_time()))  # A's claim expires (A died)
    taken = await any_store.claim_outbox("relay-b", limit=10, hold=30)
    assert [(row.job_key, row.fence) for row in taken] == [("k1", 1), ("k2", 2), ("k1", 3)]
    assert await any_store.mark_sent("relay-a", [first[0].id]) == 0
    assert await any_store.mark_sent("relay-b", [row.id for row in taken]) == 3
    assert all(sent for _, sent in await any_store.outbox())
    assert await any_store.claim_outbox("relay-a", limit=10, hold=30) == []


async def test_two_relays_claims_keep_every_keys_order_in_random_queues(
    any_store: EffectStore,
) -> None:
    """Random queues of a few keys, part held by relay A: B's claim keeps each key's order.

    Neither claim takes a row whose key has an earlier unsent row left out of
    it; B takes nothing A holds; and B is not empty when the oldest row A
    does not hold has no earlier row of its key (the rule of docs/effects.md,
    the same on every backend however each reaches it).
    """
    rnd = random.Random(2026)
    fence = 0
    for case in range(25):
        for _ in range(rnd.randint(1, 20)):
            fence += 1
            key = f"c{case}:k{rnd.randint(1, rnd.randint(1, 6))}"
            async with any_store.transaction(key, f"v{fence}", fence) as tx:
                await tx.commit(request(fence, f"v{fence}", key), [Message.build("t", fence)])
        queue = [row for row, sent in await any_store.outbox() if not sent]
        held = await any_store.claim_outbox("relay-a", limit=rnd.randint(0, 12), hold=30)
        taken = await any_store.claim_outbox("relay-b", limit=rnd.randint(1, 12), hold=30)
        where = f"case {case}: queue {[(r.id, r.job_key) for r in queue]}"
        held_ids, taken_ids = {r.id for r in held}, {r.id for r in taken}
        assert not held_ids & taken_ids, where
        for claim in (held_ids, taken_ids):
            for row in queue:
                if row.id in claim:
                    earlier = [e.id for e in queue if e.job_key == row.job_key and e.id < row.id]
                    assert set(earlier) <= claim, f"{where}: {sorted(claim)} took {row.id}"
        free = [row for row in queue if row.id not in held_ids]
        if free and not any(r.job_key == free[0].job_key for r in held):
            assert taken, f"{where}: A holds {sorted(held_ids)}, B took nothing"
        for relay, rows in (("relay-a", held), ("relay-b", taken)):
            await any_store.mark_sent(relay, [r.id for r in rows])
        while rest := await any_store.claim_outbox("relay-c", limit=100, hold=30):
            await any_store.mark_sent("relay-c", [r.id for r in rest])


async def test_released_messages_are_claimed_again_at_once(any_store: EffectStore) -> None:
    """A relay stopping (SIGTERM) releases its unsent claims: another takes them without waiting."""
    async with any_store.transaction(KEY, "v1", 1) as tx:
        await tx.commit(request(1), [Message.build("t", "one"), Message.build("t", "two")])
    held = await any_store.claim_outbox("relay-a", limit=10, hold=300)
    assert await any_store.claim_outbox("relay-b", limit=10, hold=300) == []
    await any_store.release_outbox("relay-a", [row.id for row in held])
    again = await any_store.claim_outbox("relay-b", limit=10, hold=300)
    assert [row.message.value for row in again] == [b"one", b"two"]


async def test_claimed_rows_carry_the_effect_id_written_at_commit(
    sql_store: tuple[EffectStore, str],
) -> None:
    """Written at commit, read by claims and entries; a row of earlier code (NULL) computes it."""
    store, url = sql_store
    await write(store, 3, messages=2)
    value, committed_at = ("x'78'", "0") if url.startswith("sqlite") else ("'x'", "now()")
    await raw(  # as a pod before schema 11 inserts: no effect_id
        url,
        "INSERT INTO leaseworker_outbox (job_key, input_version, seq, fence, topic, value,"
        f" headers, trace, committed_at) VALUES ('old', 'v1', 0, 1, 't', {value}, '[]', '[]',"
        f" {committed_at})",
    )
    claimed = await store.claim_outbox("relay", limit=10, hold=30.0)
    assert [(row.job_key, row.stored_effect_id) for row in claimed] == [
        (KEY, effect_id(KEY, "v1", 0)),
        (KEY, effect_id(KEY, "v1", 1)),
        ("old", None),
    ]
    assert [row.effect_id for row in claimed] == [
        effect_id(KEY, "v1", 0),
        effect_id(KEY, "v1", 1),
        effect_id("old", "v1", 0),
    ]
    entries = await store.outbox_entries()
    assert [entry.row.stored_effect_id for entry in entries] == [
        row.stored_effect_id for row in claimed
    ]


async def test_a_prune_deletes_at_most_its_limit(sql_store: tuple[EffectStore, str]) -> None:
    """Two relay rounds of three sent rows, a limit of four: never six in one call.

    A round of sent rows goes whole on PostgreSQL (it records a round as one
    row); a round bigger than the limit goes alone, so pruning never stalls.
    """
    any_store, _ = sql_store
    for version in ("v1", "v2"):
        async with any_store.transaction(KEY, version, 1) as tx:
            await tx.commit(request(1, version), [Message.build("t", b"m")] * 3)
        held = await any_store.claim_outbox("relay", limit=10, hold=300)
        assert await any_store.mark_sent("relay", [row.id for row in held]) == 3
    assert await any_store.prune_outbox(0, limit=4) in (3, 4)  # rows one by one: up to 4
    assert await any_store.prune_outbox(0, limit=4) in (2, 3)
    assert await any_store.outbox() == []
    async with any_store.transaction(KEY, "v3", 1) as tx:
        await tx.commit(request(1, "v3"), [Message.build("t", b"m")] * 3)
    held = await any_store.claim_outbox("relay", limit=10, hold=300)
    assert await any_store.mark_sent("relay", [row.id for row in held]) == 3
    assert await any_store.prune_outbox(0, limit=2) in (2, 3)  # a round alone may exceed it


async def test_transactions_and_batches_of_two_pods_on_the_same_keys_never_deadlock(
    store_url_for: Callable[[str], str],
) -> None:
    """Pod A's jobs hold 12 keys' head rows in transactions while pod B batches all 24 keys.

    B starts once A's transactions all hold their rows, and A commits only
    once the server shows one of B's statements waiting on a lock. B's batch
    locks head rows in job key order and waits on A's; A's transactions wait
    for nothing of B's, so they commit and B goes on: no cycle, every call
    answers (a deadlock would end in StoreUnavailable). Each key ends with the
    higher fence, and A's messages are all there.
    """
    url = store_url_for("postgresql")
    keys = [f"report:{n:02d}" for n in range(24)]
    held_by_a = keys[::2]
    async with (
        open_store(url, max_connections=len(held_by_a)) as first,  # every transaction at once
        open_store(url) as second,
        await psycopg.AsyncConnection.connect(url, autocommit=True) as watcher,
    ):
        a, b = effect_store(first), effect_store(second)
        statuses: list[str] = []
        committed: list[str] = []
        opened: list[str] = []
        all_held, b_waits = anyio.Event(), anyio.Event()

        async def transact(key: str) -> None:
            async with a.transaction(key, "v10", 10) as tx:
                assert tx.opened.status == "claimed"  # B has not started yet
                opened.append(key)
                if len(opened) == len(held_by_a):
                    all_held.set()
                await b_waits.wait()
                answer = await tx.commit(request(10, key=key), [Message.build("t", key)])
            assert answer.status == "accepted"
            committed.append(key)

        async def claim_then_complete(key: str) -> None:
            statuses.append((await b.claim(key, "v11", 11)).status)
            statuses.append((await b.complete(request(11, "v11", key))).status)

        async def someone_waits_for_a_lock() -> bool:
            cursor = await watcher.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            row = await cursor.fetchone()
            return row is not None and int(row[0]) > 0

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for key in held_by_a:
                    tg.start_soon(transact, key)
                await all_held.wait()
                for key in keys[::-1]:
                    tg.start_soon(claim_then_complete, key)
                await eventually(someone_waits_for_a_lock)  # B's batch waits on A's rows
                b_waits.set()
        states = [await first.state(key) for key in keys]
        messages = await a.outbox()
    assert set(statuses) <= {"claimed", "accepted"}  # B's fence is the higher one
    assert all(state is not None and state.fence == 11 for state in states)
    assert sorted(committed) == held_by_a  # A's transactions held rows B waited for
    assert sorted(row.job_key for row, _ in messages) == held_by_a


async def test_postgres_outbox_pages_keep_room_for_a_claims_row_version(
    store_url_for: Callable[[str], str],
) -> None:
    """Migration 7: fillfactor 50, so a claim's update stays on its page (HOT, no index writes).

    The relay's drain bench bounds this: every claim rewrites each row it takes.
    """
    url = store_url_for("postgresql")
    async with open_store(url):
        options = await raw(
            url, "SELECT reloptions FROM pg_class WHERE relname = 'leaseworker_outbox'"
        )
    assert options == [(["fillfactor=50"],)]


async def test_a_postgres_claim_of_most_of_the_queue_reads_its_rows_by_id(
    store_url_for: Callable[[str], str],
) -> None:
    """1,000 of 1,500 unsent rows, 300 held by another relay: fetched through the primary key.

    The planner guesses that few candidates are ready; joined with them, it
    once scanned the whole outbox per ready row (half a million rows compared,
    22 ms instead of 4). The rows another relay holds are matched to the
    candidates by key in one hash, not compared with each (300,000 rows
    removed by a join filter).
    """
    url = store_url_for("postgresql")
    async with open_store(url) as opened:
        assert isinstance(opened, PostgresStore)
        await _queue_rows(url, 1500)
        claim = opened._claims.query(1000)
        async with (
            await psycopg.AsyncConnection.connect(url) as other,
            await psycopg.AsyncConnection.connect(url) as conn,
        ):
            await other.execute(
                "SELECT id FROM leaseworker_outbox_unsent ORDER BY id LIMIT 300 FOR UPDATE"
            )
            cursor = await conn.execute(pgsql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ") + claim)
            row = await cursor.fetchone()
            await conn.rollback()
            await other.rollback()
    assert row is not None
    nodes = list(_plan_nodes(row[0][0]["Plan"]))
    assert nodes[0]["Actual Rows"] == 1000
    outbox = [node for node in nodes if node.get("Relation Name") == "leaseworker_outbox"]
    assert [node["Node Type"] for node in outbox] in (["Index Scan"], ["Bitmap Heap Scan"])
    assert sum(node.get("Rows Removed by Join Filter", 0) for node in nodes) == 0


async def test_a_postgres_claim_passes_the_rows_this_process_holds_before_trying_locks(
    store_url_for: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two rounds of 1,000 held by this process: the next claim's scan filters them out first.

    ``SKIP LOCKED`` passes them as well, but only after trying each one's lock
    (2,000 tries, a third of the claim's time in PostgreSQL). The claim takes
    the next 1,000 rows either way. The floor is off (it would start the scan
    past both rounds): what is shown is the filter of a claim from the start.
    """
    monkeypatch.setattr(_pg_claims, "FLOOR_FOR", 0.0)
    url = store_url_for("postgresql")
    async with open_store(url) as opened:
        assert isinstance(opened, PostgresStore)
        store = effect_store(opened)
        await _queue_rows(url, 3000)
        held = [await store.claim_outbox(f"r/{n}", limit=1000, hold=30.0) for n in range(2)]
        claim = opened._claims.query(1000)
        async with await psycopg.AsyncConnection.connect(url) as conn:
            cursor = await conn.execute(pgsql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ") + claim)
            row = await cursor.fetchone()
            await conn.rollback()
        third = await store.claim_outbox("r/2", limit=1000, hold=30.0)
        for n, rows in enumerate([*held, third]):
            await store.release_outbox(f"r/{n}", [r.id for r in rows])
    assert row is not None
    nodes = list(_plan_nodes(row[0][0]["Plan"]))
    (locks,) = [node for node in nodes if node["Node Type"] == "LockRows"]
    (below,) = locks["Plans"]  # what the lock is tried on: the rows the scan let through
    assert (below["Actual Rows"], locks["Actual Rows"]) == (1000, 1000)
    ids = sorted(r.id for rows in [*held, third] for r in rows)
    assert len(set(ids)) == 3000
    assert [r.id for r in third] == ids[2000:]


async def test_a_postgres_mark_reads_its_rows_by_key_however_long_the_queue(
    store_url_for: Callable[[str], str],
) -> None:
    """1,000 claimed rows of 20,000 queued: the mark deletes them through the primary key.

    The planner, costing each index probe as a disk read, scanned the whole
    queue for the mark once it held a few thousand rows: a mark's cost grew
    with the backlog (16.6 ms at 200,000 queued). The claim's statements
    that end it are run as ``update`` runs them, in a transaction holding the rows.
    """
    url = store_url_for("postgresql")
    async with open_store(url):
        await _queue_rows(url, 20_000)
        async with await psycopg.AsyncConnection.connect(url) as conn:
            locked = await conn.execute(
                "SELECT id FROM leaseworker_outbox_unsent ORDER BY id LIMIT 1000 FOR UPDATE"
            )
            ids = [row_id for (row_id,) in await locked.fetchall()]
            setting, mark = _pg_claims.settle_statements("r/0", ids, [])
            await conn.execute(setting)
            cursor = await conn.execute(pgsql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ") + mark)
            row = await cursor.fetchone()
            await conn.rollback()
    assert row is not None
    nodes = list(_plan_nodes(row[0][0]["Plan"]))
    queue = [node for node in nodes if node.get("Relation Name") == "leaseworker_outbox_unsent"]
    assert [node["Node Type"] for node in queue if "Scan" in node["Node Type"]] in (
        ["Index Scan"],
        ["Bitmap Heap Scan"],
    ), [node["Node Type"] for node in nodes]
    assert sum(node.get("Rows Removed by Filter", 0) for node in nodes) == 0


async def _commit_one(store: EffectStore, key: str, fence: int) -> None:
    """Commit one execution of ``key`` at ``fence`` with one message."""
    async with store.transaction(key, f"v{fence}", fence) as tx:
        await tx.commit(request(fence, f"v{fence}", key), [Message.build("t", fence)])


async def test_a_postgres_claim_behind_a_full_one_starts_past_it_and_keeps_each_keys_order(
    store_url_for: Callable[[str], str],
) -> None:
    """After a full claim, the next looks for candidates past it, and for left-out rows below.

    Pod B holds k1's first row; pod A's full claim takes k2's; B gives k1's
    back. A's next claim starts past its own rows, where only k1's second row
    is, and takes nothing: k1's first row, below, is found from the queue's
    start. That claim was short, so the one after it starts at the start and
    takes both of k1's rows, in order.
    """
    url = store_url_for("postgresql")
    async with open_store(url) as opened_a, open_store(url) as opened_b:
        pod_a, pod_b = effect_store(opened_a), effect_store(opened_b)
        await _commit_one(pod_a, "k1", 1)
        await _commit_one(pod_a, "k2", 2)
        held = await pod_b.claim_outbox("b", limit=1, hold=30.0)
        full = await pod_a.claim_outbox("a/0", limit=1, hold=30.0)
        assert ([r.job_key for r in held], [r.job_key for r in full]) == (["k1"], ["k2"])
        await _commit_one(pod_a, "k1", 3)
        await pod_b.release_outbox("b", [row.id for row in held])
        assert await pod_a.claim_outbox("a/1", limit=10, hold=30.0) == []
        again = await pod_a.claim_outbox("a/2", limit=10, hold=30.0)
        assert [(row.job_key, row.fence) for row in again] == [("k1", 1), ("k1", 3)]
        for name, rows in (("a/0", full), ("a/2", again)):
            await pod_a.release_outbox(name, [row.id for row in rows])


async def test_a_postgres_claims_floor_lapses_so_rows_left_below_it_are_claimed(
    store_url_for: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row given back below the floor by another pod waits for ``FLOOR_FOR``, no longer.

    Pod A's full claims start past each other; pod B's row, given back below
    them, is passed over until the floor lapses; then A's claim starts at the
    queue's start and takes it first.
    """
    clock = [1000.0]
    monkeypatch.setattr(_pg_claims, "_now", lambda: clock[0])
    url = store_url_for("postgresql")
    async with open_store(url) as opened_a, open_store(url) as opened_b:
        pod_a, pod_b = effect_store(opened_a), effect_store(opened_b)
        for n in range(1, 5):
            await _commit_one(pod_a, f"k{n}", n)
        held = await pod_b.claim_outbox("b", limit=1, hold=30.0)
        claims = [await pod_a.claim_outbox("a/0", limit=1, hold=30.0)]
        await pod_b.release_outbox("b", [row.id for row in held])
        claims.append(await pod_a.claim_outbox("a/1", limit=1, hold=30.0))
        clock[0] += _pg_claims.FLOOR_FOR
        claims.append(await pod_a.claim_outbox("a/2", limit=1, hold=30.0))
        assert [row.job_key for row in held] == ["k1"]
        assert [[row.job_key for row in rows] for rows in claims] == [["k2"], ["k3"], ["k1"]]
        for n, rows in enumerate(claims):
            await pod_a.release_outbox(f"a/{n}", [row.id for row in rows])


async def _queue_rows(url: str, count: int) -> None:
    """Commit ``count`` unsent outbox rows of distinct job keys, as the relay finds them."""
    await raw(
        url,
        "WITH added AS (INSERT INTO leaseworker_outbox (job_key, input_version, seq, fence,"
        " topic, value, headers, trace, queued) SELECT 'k' || n, 'v1', 0, 1, 't', 'x', '[]',"
        f" '[]', true FROM generate_series(1, {int(count)}) n RETURNING id, job_key)"
        " INSERT INTO leaseworker_outbox_unsent (id, job_key) SELECT id, job_key FROM added",
    )


def _plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``node`` of an EXPLAIN (FORMAT JSON) plan and every node under it."""
    yield node
    for child in node.get("Plans", ()):
        yield from _plan_nodes(child)


async def test_postgres_outbox_rounds_store_their_arrays_uncompressed(
    store_url_for: Callable[[str], str],
) -> None:
    """Migration 10: a round's id and attempt arrays are not compressed at each mark."""
    url = store_url_for("postgresql")
    async with open_store(url):
        storage = await raw(
            url,
            "SELECT attname, attstorage FROM pg_attribute WHERE attrelid ="
            " 'leaseworker_outbox_sent'::regclass AND attname IN ('ids', 'attempts')"
            " ORDER BY attname",
        )
    assert storage == [("attempts", "e"), ("ids", "e")]


async def test_a_schema_8_outbox_migrates_to_the_queue_and_sent_rounds(
    store_url_for: Callable[[str], str],
) -> None:
    """Migration 9 on PostgreSQL: unsent rows queued, sent rows kept sent, nothing sent twice.

    A database of schema 8 with one sent and one unsent message: after the
    migration the sent one is in a round (its time and attempts kept) and is
    never claimed, the unsent one is claimed and marked with one write, a
    schema-8 relay's claim query takes no row committed after it (it would
    send again what this version sent), and retention deletes both.
    """
    url = store_url_for("postgresql")
    old = await PostgresStore.open(
        parse_store_url(url), call_timeout=5.0, migrations=MIGRATIONS[:8]
    )
    await old.aclose()
    for key, sent in (("old-sent", "now() - interval '1 hour'"), ("old-unsent", "NULL")):
        await raw(
            url,
            "INSERT INTO leaseworker_outbox (job_key, input_version, seq, fence, topic, value,"
            f" headers, trace, sent_at, claimed_by, attempts) VALUES ('{key}', 'v1', 0, 1, 't',"
            f" 'x', '[]', '[]', {sent}, 'pod-0', 1)",
        )
    # Schema 8 predates 0.1.0, the oldest release a pod runs beside: store migrate's to do.
    assert await migrate_store(url) == MIGRATIONS[-1].version
    async with open_store(url, call_timeout=5.0) as opened:
        store = effect_store(opened)
        by_key = {entry.row.job_key: entry for entry in await store.outbox_entries()}
        assert (by_key["old-sent"].sent, by_key["old-sent"].attempts) == (True, 1)
        assert (by_key["old-unsent"].sent, by_key["old-unsent"].attempts) == (False, 1)
        count, age = await store.outbox_backlog()
        assert count == 1
        assert age is not None
        assert age < 60
        async with store.transaction("new", "v1", 1) as tx:
            await tx.commit(request(1, key="new"), [Message.build("t", b"y")])
        legacy = await raw(url, _SCHEMA_8_CLAIM)
        assert [key for (key,) in legacy] == ["old-unsent"]  # never a row committed since
        claimed = await store.claim_outbox("relay", limit=10, hold=30.0)
        assert [row.job_key for row in claimed] == ["old-unsent", "new"]
        assert await store.mark_sent("relay", [row.id for row in claimed]) == 2
        assert await store.claim_outbox("relay", limit=10, hold=30.0) == []
        entries = await store.outbox_entries()
        assert [(e.row.job_key, e.sent, e.attempts) for e in entries] == [
            ("old-sent", True, 1),
            ("old-unsent", True, 2),
            ("new", True, 1),
        ]
        assert await raw(
            url, "SELECT count(*) FROM leaseworker_outbox WHERE sent_at IS NOT NULL"
        ) == [(1,)]
        assert await store.outbox_backlog() == (0, None)
        assert await store.prune_outbox(600) == 1  # the one sent an hour ago
        assert await store.prune_outbox(0) == 2
        assert await store.outbox_entries() == []


_SCHEMA_8_CLAIM = """
    SELECT job_key FROM leaseworker_outbox
    WHERE sent_at IS NULL AND (claimed_until IS NULL OR claimed_until < statement_timestamp())
    ORDER BY id
"""
