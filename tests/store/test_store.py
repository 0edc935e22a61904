"""The completion store's fencing and identity rules, on real PostgreSQL and real SQLite.

Every test here runs once per backend (the ``store_url`` fixture). The store is
opened through the public ``open_store``; the test's view of the truth is a
direct connection to the same database (:func:`raw`).
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import anyio
import psycopg
import pytest

from leaseworker import (
    Completion,
    CompletionRequest,
    CompletionResult,
    CompletionStore,
    ConfigError,
    StoreUnavailable,
    fenced_upsert,
    open_store,
)
from leaseworker._store import MAX_FENCE, MIGRATIONS, Head, Migration, decide, parse_store_url
from leaseworker._store._postgres import PostgresStore
from leaseworker._store._sqlite import SqliteStore

ALL_VERSIONS = [(m.version,) for m in MIGRATIONS]


def now_fence() -> int:
    """A time-floored fence, as the acquire script hands out after a Redis data loss."""
    return time.time_ns() // 1000


async def raw(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run one statement on a connection of its own (autocommit); return its rows."""
    if url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///")
        with contextlib.closing(sqlite3.connect(path)) as conn, conn:
            return list(conn.execute(sql.replace("%s", "?"), params).fetchall())
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as pg:
        cur2 = await pg.execute(sql, params)
        return list(await cur2.fetchall()) if cur2.description else []


async def complete(
    store: CompletionStore, key: str, version: str, fence: int, result: Any = None
) -> CompletionResult:
    """Complete ``key`` with a result naming the fence, unless one is given."""
    return await store.complete(
        CompletionRequest(
            job_key=key,
            input_version=version,
            fence=fence,
            result={"fence": fence} if result is None else result,
            execution_id=f"exec-{fence}",
            pod="pod-a",
        )
    )


async def test_fifty_concurrent_completions_leave_the_highest_fence(
    store: CompletionStore, store_url: str
) -> None:
    """50 racing completions with random fences: only the highest fence's result remains.

    All start together. Every attempt ends ``accepted`` or ``stale`` (never an
    error); the highest fence is accepted; every ``stale`` one names a higher
    winning fence and left no row behind. A second wave of 50 lower fences
    (half retries of first-wave identities, half new) gets only ``stale`` or
    ``duplicate`` and changes nothing.
    """
    rng = random.Random(1729)
    base = now_fence()
    fences = rng.sample(range(base, base + 1_000_000), 50)
    top = max(fences)
    gate = anyio.Event()
    outcomes: dict[int, CompletionResult] = {}

    async def attempt(i: int, version: str, fence: int) -> None:
        await gate.wait()
        outcomes[i] = await complete(store, "report:acme:2026-11", version, fence)

    async with anyio.create_task_group() as tg:
        for i, fence in enumerate(fences):
            tg.start_soon(attempt, i, f"v{i}", fence)
        gate.set()

    assert len(outcomes) == 50
    assert {o.status for o in outcomes.values()} <= {"accepted", "stale"}
    assert outcomes[fences.index(top)].status == "accepted"
    for i, outcome in outcomes.items():
        stored = await store.lookup("report:acme:2026-11", f"v{i}")
        if outcome.status == "stale":
            assert outcome.winning_fence > fences[i]
            assert outcome.completion is not None
            assert outcome.completion.fence == outcome.winning_fence
            assert stored is None  # a stale attempt writes nothing
        else:
            assert stored is not None
            assert stored.result == {"fence": fences[i]}
    state = await store.state("report:acme:2026-11")
    assert state is not None
    assert (state.fence, state.result) == (top, {"fence": top})

    accepted = sum(o.status == "accepted" for o in outcomes.values())
    gate = anyio.Event()
    outcomes.clear()
    lower = [rng.randrange(base, top) for _ in range(50)]
    async with anyio.create_task_group() as tg:
        for i, fence in enumerate(lower):
            tg.start_soon(attempt, i, f"v{i}" if i % 2 else f"w{i}", fence)
        gate.set()
    assert {o.status for o in outcomes.values()} <= {"stale", "duplicate"}
    assert all(o.winning_fence == top for o in outcomes.values())
    assert await store.state("report:acme:2026-11") == state
    rows = await raw(store_url, "SELECT count(*) FROM leaseworker_completions")
    assert rows == [(accepted,)]


@pytest.fixture(params=["postgresql", "sqlite", "memory"])
async def any_store(
    request: pytest.FixtureRequest, store_url_for: Callable[[str], str]
) -> AsyncIterator[CompletionStore]:
    """An open store on each backend in turn, ``memory://`` included (API-only tests)."""
    async with open_store(store_url_for(request.param)) as opened:
        yield opened


@pytest.mark.parametrize("seed", [7, 42, 1729])
async def test_every_answer_matches_the_reference_rule(
    any_store: CompletionStore, seed: int
) -> None:
    """Model check: 60 completions over 3 job keys, each answered as ``decide`` says.

    The durable backends state the fencing rule in SQL, ``memory://`` calls
    ``_model.decide``, which states it in Python. A random sequence (few
    versions and fences, so duplicates, ties and stale fences all occur) runs
    against the store and against an in-memory model; status, winning fence
    and standing completion must agree at every step, and ``state``/``lookup``
    must match the model at the end.
    """
    rng = random.Random(seed)
    heads: dict[str, Head] = {}
    done: dict[tuple[str, str], int] = {}  # identity -> its accepted fence
    for _ in range(60):
        key, version, fence = rng.choice("abc"), f"v{rng.randrange(4)}", rng.randrange(1, 8)
        existing = done.get((key, version))
        standing = None if existing is None else _modelled(key, version, existing)
        expected = decide(standing, heads.get(key), fence)
        answer = await complete(any_store, key, version, fence)
        assert answer.status == expected
        if expected == "accepted":
            heads[key] = Head(fence=fence, input_version=version)
            done[(key, version)] = fence
        head = heads[key]
        assert answer.winning_fence == head.fence
        winner = (key, version) if expected == "duplicate" else (key, head.input_version)
        assert answer.completion is not None
        assert (answer.completion.input_version, answer.completion.fence) == (
            winner[1],
            done[winner],
        )
    for key, head in heads.items():
        state = await any_store.state(key)
        assert state is not None
        assert (state.input_version, state.fence) == (head.input_version, head.fence)
    for (key, version), fence in done.items():
        found = await any_store.lookup(key, version)
        assert found is not None
        assert found.fence == fence
        assert found.result == {"fence": fence}


def _modelled(key: str, version: str, fence: int) -> Completion:
    """The model's record of an accepted completion (only identity and fence matter)."""
    return Completion(
        job_key=key,
        input_version=version,
        fence=fence,
        result={"fence": fence},
        execution_id=f"exec-{fence}",
        pod="pod-a",
        completed_at=datetime.now(UTC),
    )


async def test_older_fence_after_newer_is_stale(any_store: CompletionStore) -> None:
    """A paused worker waking up with an older fence gets ``stale``; the newer result stays."""
    newer = await complete(any_store, "k", "v-new", 20, {"total": 2})
    older = await complete(any_store, "k", "v-old", 10, {"total": 1})
    assert newer.status == "accepted"
    assert older.status == "stale"
    assert (older.fence, older.winning_fence) == (10, 20)
    assert older.result == {"total": 2}  # what the store holds: the winner's result
    state = await any_store.state("k")
    assert state is not None
    assert (state.fence, state.input_version, state.result) == (20, "v-new", {"total": 2})
    assert await any_store.lookup("k", "v-old") is None


async def test_redelivered_identity_is_duplicate_and_rewrites_nothing(
    any_store: CompletionStore,
) -> None:
    """Same job key and input version again: ``duplicate`` with the first result, unchanged.

    Even with a newer fence and a different result: a redelivered trigger must
    not recompute or overwrite what its identity already produced.
    """
    first = await complete(any_store, "k", "v1", 5, {"total": 1})
    again = await any_store.complete(
        CompletionRequest(
            job_key="k",
            input_version="v1",
            fence=9,
            result={"total": 999},
            execution_id="e2",
            pod="pod-b",
        )
    )
    assert first.status == "accepted"
    assert again.status == "duplicate"
    assert again.completion == first.completion
    assert again.result == {"total": 1}
    assert again.winning_fence == 5
    assert await any_store.state("k") == first.completion
    assert await any_store.lookup("k", "v1") == first.completion


async def test_new_input_version_is_a_new_completion(any_store: CompletionStore) -> None:
    """A new input version for the same job key is a new report, not a retry.

    It is accepted when its fence is at least the highest accepted (equal
    included), and ``stale`` below it; the old identity stays answerable.
    """
    v1 = await complete(any_store, "k", "v1", 7, {"total": 1})
    v2 = await complete(any_store, "k", "v2", 7, {"total": 2})
    v3 = await complete(any_store, "k", "v3", 6, {"total": 3})
    v4 = await complete(any_store, "k", "v4", 8, {"total": 4})
    assert [r.status for r in (v1, v2, v3, v4)] == ["accepted", "accepted", "stale", "accepted"]
    state = await any_store.state("k")
    assert state is not None
    assert (state.input_version, state.fence, state.result) == ("v4", 8, {"total": 4})
    old = await any_store.lookup("k", "v1")
    assert old is not None
    assert old.result == {"total": 1}
    assert await any_store.lookup("k", "v3") is None


async def test_lookup_many_answers_each_identity_in_order_in_one_call(
    any_store: CompletionStore,
) -> None:
    """A poll's lookup: completed, never completed and a claim-only key, each in its place."""
    v1 = await complete(any_store, "k", "v1", 3, {"total": 1})
    other = await complete(any_store, "other", "v1", 1)
    await any_store.claim("claimed-only", "v1", 5)
    wanted = [("claimed-only", "v1"), ("k", "v1"), ("k", "v2"), ("other", "v1"), ("k", "v1")]
    found = await any_store.lookup_many(wanted)
    assert found == [None, v1.completion, None, other.completion, v1.completion]
    assert await any_store.lookup_many([]) == []


async def test_fences_are_per_job_key(any_store: CompletionStore) -> None:
    """A high fence on one job key does not make another key's lower fence stale."""
    assert (await complete(any_store, "a", "v", 1_000)).status == "accepted"
    assert (await complete(any_store, "b", "v", 1)).status == "accepted"


async def test_time_floored_fences_fit_and_win_after_redis_data_loss(
    any_store: CompletionStore,
) -> None:
    """Fences jump from a small counter to microseconds since the epoch (~1.8e15) and fit.

    After Redis loses its counter, the acquire script floors fences at its
    clock, so the next completion is accepted and the old, small fence is stale.
    The columns hold the full signed 64-bit range; beyond it is refused up front.
    """
    assert (await complete(any_store, "k", "v1", 3)).status == "accepted"
    floored = now_fence()
    assert floored > 1.7e15
    accepted = await complete(any_store, "k", "v2", floored)
    assert (accepted.status, accepted.winning_fence) == ("accepted", floored)
    assert (await complete(any_store, "k", "v3", 4)).status == "stale"
    assert (await complete(any_store, "k", "v4", MAX_FENCE)).status == "accepted"
    state = await any_store.state("k")
    assert state is not None
    assert state.fence == MAX_FENCE
    for bad in (MAX_FENCE + 1, -1, True):
        with pytest.raises(ConfigError, match="fence"):
            await complete(any_store, "k", "v5", bad)


async def test_failure_mid_transaction_leaves_fence_and_result_untouched(
    store: CompletionStore, store_url: str
) -> None:
    """A fault after the head row was written and before the result row: nothing half-written.

    A trigger injected into the test database fails the completion insert (on
    PostgreSQL it kills the server process serving the connection; on SQLite
    it aborts the statement, leaving the transaction for the adapter to roll
    back). The call raises StoreUnavailable carrying the job key; the fence and
    result stay as before, a new job key stays absent, and once the fault is
    gone the same call is accepted.
    """
    before = await complete(store, "k", "v1", 10, {"total": 1})
    if store_url.startswith("sqlite"):
        await raw(
            store_url,
            "CREATE TRIGGER fault BEFORE INSERT ON leaseworker_completions"
            " BEGIN SELECT RAISE(ABORT, 'injected fault'); END",
        )
    else:
        await raw(
            store_url,
            "CREATE FUNCTION fault() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NEW; END $$",
        )
        await raw(
            store_url,
            "CREATE TRIGGER fault BEFORE INSERT ON leaseworker_completions"
            " FOR EACH ROW EXECUTE FUNCTION fault()",
        )
    for key, version in (("k", "v2"), ("new", "v1")):
        with pytest.raises(StoreUnavailable) as failed:
            await complete(store, key, version, 20, {"total": 2})
        assert failed.value.key == key
        assert "total" not in str(failed.value)
    assert await store.state("k") == before.completion
    assert await store.lookup("k", "v2") is None
    assert await store.state("new") is None
    assert await raw(store_url, "SELECT fence FROM leaseworker_jobs ORDER BY job_key") == [(10,)]

    on_table = "" if store_url.startswith("sqlite") else " ON leaseworker_completions"
    await raw(store_url, f"DROP TRIGGER fault{on_table}")
    assert (await complete(store, "k", "v2", 20)).status == "accepted"


async def test_opening_twice_migrates_once(store_url: str) -> None:
    """Reopening an existing store keeps its data and records each schema version once."""
    async with open_store(store_url) as first:
        await complete(first, "k", "v1", 1)
    async with open_store(store_url) as second:
        assert await second.lookup("k", "v1") is not None
    rows = await raw(store_url, "SELECT version FROM leaseworker_schema_version ORDER BY version")
    assert rows == ALL_VERSIONS


async def test_concurrent_first_opens_migrate_exactly_once(store_url: str) -> None:
    """Four pods starting at once on an empty database all open it; the schema is built once."""
    opened = 0
    all_open = anyio.Event()

    async def pod() -> None:
        nonlocal opened
        async with open_store(store_url) as store:
            opened += 1
            if opened == 4:
                all_open.set()
            await all_open.wait()
            await complete(store, "k", f"v{opened}", opened)

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(pod)
    rows = await raw(store_url, "SELECT version FROM leaseworker_schema_version ORDER BY version")
    assert rows == ALL_VERSIONS


async def test_a_later_migration_applies_alone_and_older_code_still_opens(
    store_url: str,
) -> None:
    """Migrations are an ordered list: a new version applies on top, once.

    Opening again with the shorter list (an older pod during a rollout) leaves
    the newer schema alone and keeps working.
    """
    parsed = parse_store_url(store_url)
    latest = len(MIGRATIONS)
    extra = Migration(
        version=latest + 1,
        description="test: an extra table",
        postgresql=("CREATE TABLE lw_extra (x integer)",),
        sqlite=("CREATE TABLE lw_extra (x INTEGER)",),
    )

    async def open_with(migrations: tuple[Migration, ...]) -> PostgresStore | SqliteStore:
        if parsed.backend == "postgresql":
            return await PostgresStore.open(parsed, call_timeout=5.0, migrations=migrations)
        return await SqliteStore.open(parsed, call_timeout=5.0, migrations=migrations)

    rounds = ((MIGRATIONS, latest), ((*MIGRATIONS, extra), latest + 1), (MIGRATIONS, latest + 1))
    for migrations, expected in rounds:
        store = await open_with(migrations)
        try:
            assert store.schema_version == expected
            await complete(store, "k", f"v{expected}", expected)
        finally:
            await store.aclose()
    rows = await raw(store_url, "SELECT version FROM leaseworker_schema_version ORDER BY version")
    assert rows == [*ALL_VERSIONS, (latest + 1,)]
    assert await raw(store_url, "SELECT count(*) FROM lw_extra") == [(0,)]


async def test_fenced_upsert_never_lets_a_stale_fence_overwrite(store_url: str) -> None:
    """The fence guard for effects outside the store: an older fence writes nothing.

    The job's own table, written with the SQL from ``fenced_upsert``: fence 10
    writes, fence 5 is refused (0 rows), fence 10 again and fence 12 write.
    """
    await raw(
        store_url,
        "CREATE TABLE report (tenant text, period text, total integer, fence bigint,"
        " PRIMARY KEY (tenant, period))",
    )
    sqlite = store_url.startswith("sqlite")
    sql = fenced_upsert(
        "report",
        key=["tenant", "period"],
        columns=["total"],
        paramstyle="named" if sqlite else "pyformat",
    )

    async def write(total: int, fence: int) -> int:
        row = {"tenant": "acme", "period": "2026-11", "total": total, "fence": fence}
        if sqlite:
            path = store_url.removeprefix("sqlite:///")
            with contextlib.closing(sqlite3.connect(path)) as conn, conn:
                return conn.execute(sql, row).rowcount
        async with await psycopg.AsyncConnection.connect(store_url, autocommit=True) as pg:
            return (await pg.execute(sql, row)).rowcount

    assert [await write(1, 10), await write(2, 5), await write(3, 10), await write(4, 12)] == [
        1,
        0,
        1,
        1,
    ]
    assert await raw(store_url, "SELECT total, fence FROM report") == [(4, 12)]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("input_version", "v\ud800"),  # a lone surrogate: JSON decoding lets it through
        ("input_version", "v\x00"),
        ("job_key", "k\x00"),
        ("execution_id", "e\ud800"),
        ("pod", "p\n"),
    ],
)
async def test_text_no_store_could_keep_is_refused_before_any_io(
    any_store: CompletionStore, field: str, value: str
) -> None:
    """Every backend refuses the same text up front, and stays usable for the next call.

    SQLite and PostgreSQL cannot encode NUL or surrogates: the call used to
    raise the driver's encoding error (in SQLite's group commit, failing the
    other calls of its batch too), or was retried forever as unavailable.
    """
    call: dict[str, object] = {
        "job_key": "k",
        "input_version": "v1",
        "fence": 1,
        "result": {"total": 1},
        "execution_id": "e",
        "pod": "p",
    }
    call[field] = value
    bad = any_store.complete(CompletionRequest(**call))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=field.replace("_", " ")):
        await bad
    if field in ("job_key", "input_version"):
        with pytest.raises(ConfigError):
            await any_store.lookup(str(call["job_key"]), str(call["input_version"]))
    assert (await complete(any_store, "k", "v1", 1, {"total": 1})).status == "accepted"


@pytest.mark.parametrize("text", ["nul\x00", "lone \udc00", "pair as two \ud83d\ude00"])
async def test_results_with_text_no_store_could_keep_are_refused(
    any_store: CompletionStore, text: str
) -> None:
    """A result holding NUL or surrogate code points is a ValueError on every backend.

    PostgreSQL's jsonb refuses them; the others must not keep what it cannot.
    An ordinary non-ASCII result is kept as it is.
    """
    for result in ({"note": text}, [text], {text: 1}):
        with pytest.raises(ValueError, match="no store keeps"):
            await complete(any_store, "k", "v1", 1, result)
    kept = await complete(any_store, "k", "v1", 1, {"note": "déjà vu 😀"})
    assert kept.status == "accepted"
    assert kept.result == {"note": "déjà vu 😀"}


async def test_unusual_but_valid_text_is_kept_as_it_is(any_store: CompletionStore) -> None:
    """Emoji (joined ones too), non-breaking and ideographic spaces, an empty version: kept."""
    key, version = "report\u3000acme\u00a0👩\u200d💻", ""
    accepted = await any_store.complete(
        CompletionRequest(
            job_key=key, input_version=version, fence=1, result={"n": 1}, execution_id="e", pod="p"
        )
    )
    assert accepted.status == "accepted"
    found = await any_store.lookup(key, version)
    assert found is not None
    assert (found.job_key, found.input_version) == (key, version)
