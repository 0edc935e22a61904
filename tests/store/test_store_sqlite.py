"""SQLite completion store: WAL file, the embedded default, and a lock held elsewhere."""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
import time
from pathlib import Path

import anyio
import pytest

from leaseworker import (
    ClaimResult,
    CompletionRequest,
    CompletionResult,
    ConfigError,
    StoreUnavailable,
    open_store,
)
from leaseworker._store import DEFAULT_URL, MIGRATIONS, Message, OutboxRow, parse_store_url
from leaseworker._store._sqlite import SqliteStore

TIMEOUT = 0.5
SLACK = 0.3


async def test_write_lock_held_by_another_process_bounds_the_call(tmp_path: Path) -> None:
    """Another connection (as another pod would) holds the write lock: StoreUnavailable in time.

    Nothing is written; once the lock is released the same call is accepted.
    """
    path = tmp_path / "c.sqlite3"
    async with open_store(f"sqlite:///{path}", call_timeout=TIMEOUT) as store:
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            started = time.monotonic()
            with pytest.raises(StoreUnavailable) as failed:
                await store.complete(
                    CompletionRequest(
                        job_key="k",
                        input_version="v1",
                        fence=1,
                        result={},
                        execution_id="e",
                        pod="p",
                    )
                )
            assert time.monotonic() - started < TIMEOUT + SLACK
            assert failed.value.key == "k"
            other.execute("ROLLBACK")
        assert await store.lookup("k", "v1") is None
        outcome = await store.complete(
            CompletionRequest(
                job_key="k", input_version="v1", fence=1, result={}, execution_id="e", pod="p"
            )
        )
        assert outcome.status == "accepted"


async def test_file_is_in_wal_mode(tmp_path: Path) -> None:
    """The store switches its file to WAL, so readers never block the one writer."""
    path = tmp_path / "c.sqlite3"
    async with open_store(f"sqlite:///{path}"):
        with contextlib.closing(sqlite3.connect(path)) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_unopenable_path_is_store_unavailable(tmp_path: Path) -> None:
    """A path SQLite cannot open (here a directory) fails at open with StoreUnavailable."""
    with pytest.raises(StoreUnavailable, match="cannot open") as failed:
        async with open_store(f"sqlite:///{tmp_path}"):
            pytest.fail("opened a directory as a store")
    assert failed.value.key is None


async def test_a_path_in_a_missing_directory_is_a_config_error(tmp_path: Path) -> None:
    """The directory will not appear by retrying: ConfigError, so ``leaseworker run`` exits 2."""
    with pytest.raises(ConfigError, match="missing does not exist"):
        async with open_store(f"sqlite:///{tmp_path}/missing/c.sqlite3"):
            pytest.fail("opened a store in a missing directory")


async def test_no_url_means_the_embedded_file_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``open_store()`` without a URL uses the SQLite default, a file in the working directory."""
    monkeypatch.chdir(tmp_path)
    async with open_store() as store:
        await store.complete(
            CompletionRequest(
                job_key="k", input_version="v", fence=1, result=[1], execution_id="e", pod="p"
            )
        )
    assert (tmp_path / DEFAULT_URL.removeprefix("sqlite:///")).is_file()


async def test_memory_databases_are_private_to_their_store() -> None:
    """``sqlite:///:memory:`` gives each store its own empty database (handy in tests)."""
    async with open_store("sqlite:///:memory:") as one, open_store("sqlite:///:memory:") as two:
        await one.complete(
            CompletionRequest(
                job_key="k", input_version="v", fence=1, result=1, execution_id="e", pod="p"
            )
        )
        assert await one.lookup("k", "v") is not None
        assert await two.lookup("k", "v") is None


async def test_closed_store_refuses_calls() -> None:
    """After aclose() a call raises StoreUnavailable instead of touching a closed connection."""
    async with open_store("sqlite:///:memory:") as store:
        pass
    with pytest.raises(StoreUnavailable):
        await store.state("k")


# Counts far enough to run for seconds unless something cuts it off.
_RUNAWAY = (
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 30000000)"
    " SELECT count(*) FROM n"
)


@pytest.mark.parametrize("where", ["memory", "file"])
async def test_a_statement_still_running_at_the_deadline_is_cut_off(
    where: str, tmp_path: Path
) -> None:
    """The progress handler aborts a statement at its call's deadline, on the loop or in a thread.

    The call raises StoreUnavailable with its key about ``call_timeout`` after it
    began, and the next call on the same connection works (a fresh deadline).
    """
    url = "sqlite:///:memory:" if where == "memory" else f"sqlite:///{tmp_path / 'c.sqlite3'}"
    async with open_store(url, call_timeout=TIMEOUT) as store:
        assert isinstance(store, SqliteStore)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as failed:
            await store._db.run("k", lambda conn: conn.execute(_RUNAWAY).fetchone(), writes=False)
        assert TIMEOUT <= time.monotonic() - started < TIMEOUT + SLACK
        assert failed.value.key == "k"
        outcome = await store.complete(
            CompletionRequest(
                job_key="k", input_version="v1", fence=1, result={}, execution_id="e", pod="p"
            )
        )
        assert outcome.status == "accepted"


async def test_concurrent_completions_share_fsyncs_on_a_file(tmp_path: Path) -> None:
    """Group commit: 40 completions in flight at once take far fewer than 40 fsyncs.

    Every one is accepted and readable afterwards, from a second store on the
    same file (so they are on disk, not only in this connection).
    """
    path = tmp_path / "c.sqlite3"
    async with open_store(f"sqlite:///{path}") as store:
        assert isinstance(store, SqliteStore)
        assert store._db._sync is not None
        answers = {}

        async def complete(i: int) -> None:
            answers[i] = await store.complete(
                CompletionRequest(
                    job_key=f"k{i}", input_version="v", fence=i, result=i, execution_id="e", pod="p"
                )
            )

        async with anyio.create_task_group() as tg:
            for i in range(40):
                tg.start_soon(complete, i)
        syncs = store._db._sync.syncs
    assert {a.status for a in answers.values()} == {"accepted"}
    assert 1 <= syncs < 40
    async with open_store(f"sqlite:///{path}") as other:
        for i in range(40):
            stored = await other.lookup(f"k{i}", "v")
            assert stored is not None
            assert stored.result == i


async def test_a_failed_batch_fails_each_of_its_calls_and_writes_nothing(tmp_path: Path) -> None:
    """Another process holds the write lock past the deadline: every queued call fails in time.

    None of them is half-written, and the same calls are accepted once the lock is free.
    """
    path = tmp_path / "c.sqlite3"
    async with open_store(f"sqlite:///{path}", call_timeout=TIMEOUT) as store:
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            failures: list[StoreUnavailable] = []

            async def complete(i: int) -> None:
                with pytest.raises(StoreUnavailable) as failed:
                    await store.complete(
                        CompletionRequest(
                            job_key=f"k{i}",
                            input_version="v",
                            fence=1,
                            result=i,
                            execution_id="e",
                            pod="p",
                        )
                    )
                failures.append(failed.value)

            started = time.monotonic()
            async with anyio.create_task_group() as tg:
                for i in range(10):
                    tg.start_soon(complete, i)
            assert time.monotonic() - started < TIMEOUT + SLACK
            assert {f.key for f in failures} == {f"k{i}" for i in range(10)}
            other.execute("ROLLBACK")
        for i in range(10):
            assert await store.lookup(f"k{i}", "v") is None
            outcome = await store.complete(
                CompletionRequest(
                    job_key=f"k{i}", input_version="v", fence=1, result=i, execution_id="e", pod="p"
                )
            )
            assert outcome.status == "accepted"


def _request(key: str) -> CompletionRequest:
    return CompletionRequest(
        job_key=key, input_version="v", fence=1, result={}, execution_id="e", pod="p"
    )


async def test_answers_wait_for_the_fsync_that_covers_them(tmp_path: Path) -> None:
    """A completion is answered after a helper fsync; a lookup miss and a ``claimed`` are not.

    Commits do not fsync (``synchronous=NORMAL``), so without the helper's
    fsync an accepted completion could be lost by a crash of the system.
    """
    path = tmp_path / "c.sqlite3"
    async with open_store(f"sqlite:///{path}") as store:
        assert isinstance(store, SqliteStore)
        assert store._db._sync is not None
        synchronous = store._db.conn.execute("PRAGMA synchronous").fetchone()[0]
        assert synchronous == 1  # NORMAL
        before = store._db._sync.syncs
        assert await store.lookup("k", "v") is None
        assert (await store.claim("k", "v", 1)).status == "claimed"
        assert store._db._sync.syncs == before  # neither waited for the disk
        assert (await store.complete(_request("k"))).status == "accepted"
        assert store._db._sync.syncs == before + 1
        assert (await store.claim("k", "v", 1)).status == "duplicate"  # read: must last
        assert store._db._sync.syncs == before + 2
        helper = store._db._sync._helper
    assert helper.returncode is not None  # closing the store ended its helper


async def test_a_lock_held_elsewhere_moves_the_call_off_the_loop_until_it_is_free(
    tmp_path: Path,
) -> None:
    """Another connection's write lock: the call waits in the worker thread, not on the loop.

    The loop keeps running meanwhile (a ticker advances), and the call is
    accepted once the lock is released.
    """
    path = tmp_path / "c.sqlite3"
    ticks = 0
    async with open_store(f"sqlite:///{path}") as store:
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            answers = []

            async def complete() -> None:
                answers.append(await store.complete(_request("k")))

            async with anyio.create_task_group() as tg:
                tg.start_soon(complete)
                while ticks < 20:  # the loop is free while the call waits for the lock
                    await anyio.sleep(0.005)
                    ticks += 1
                assert answers == []
                other.execute("ROLLBACK")
    assert [a.status for a in answers] == ["accepted"]


class _HeldSync:
    """A store's fsync helper held at every fsync until ``release()`` (counts the asks)."""

    def __init__(self, store: SqliteStore, monkeypatch: pytest.MonkeyPatch) -> None:
        assert store._db._sync is not None
        self.asked = 0
        self.released = anyio.Event()
        self._real = store._db._sync._sync
        monkeypatch.setattr(store._db._sync, "_sync", self._held)

    async def _held(self) -> None:
        self.asked += 1
        await self.released.wait()
        await self._real()


async def test_in_a_pods_trigger_answers_do_not_wait_and_the_barrier_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod's answers come at the commit; ``durable()`` is the one fsync the offset waits for.

    Another store on the same file (a second pod on the host) reads the
    completion before it is on disk and answers ``duplicate``: its own
    barrier's fsync covers the whole WAL, so its offset waits for that commit too.
    """
    path = tmp_path / "c.sqlite3"
    async with open_store(f"sqlite:///{path}") as first, open_store(f"sqlite:///{path}") as second:
        assert isinstance(first, SqliteStore)
        assert isinstance(second, SqliteStore)
        held = _HeldSync(first, monkeypatch)
        # As a pod's executions use them: their offset commits wait for the disk.
        first_pod, second_pod = first.settled_by_offsets(), second.settled_by_offsets()
        with anyio.fail_after(5):
            claimed = await first_pod.claim("k", "v", 1)
            accepted = await first_pod.complete(_request("k"))
            found = await second_pod.lookup_many([("k", "v")])
            again = await second_pod.claim("k", "v", 2)
        assert (claimed.status, accepted.status, again.status) == (
            "claimed",
            "accepted",
            "duplicate",
        )
        assert found[0] is not None
        assert held.asked == 0  # nothing waited for the disk
        assert second._db._sync is not None
        before = second._db._sync.syncs
        await second.durable()  # the second pod's offset barrier
        assert second._db._sync.syncs == before + 1
        async with anyio.create_task_group() as tg:
            tg.start_soon(first.durable)
            await anyio.wait_all_tasks_blocked()
            assert held.asked == 1  # the first pod's barrier waits for its fsync
            held.released.set()


async def test_the_writes_of_one_loop_pass_share_one_commit(tmp_path: Path) -> None:
    """Claims and completions made in one pass of the loop commit together, once.

    As a poll's cohort claims at once: ten claims and five completions of
    other keys are answered from one ``COMMIT``, and a second connection
    (another pod on the host) reads every one of them afterwards.
    """
    path = tmp_path / "c.sqlite3"
    async with open_store(f"sqlite:///{path}") as store:
        assert isinstance(store, SqliteStore)
        statements: list[str] = []
        store._db.conn.set_trace_callback(statements.append)
        claims: dict[int, str] = {}
        completions: dict[int, str] = {}

        async def claim(i: int) -> None:
            claims[i] = (await store.settled_by_offsets().claim(f"c{i}", "v", 2)).status

        async def complete(i: int) -> None:
            completions[i] = (await store.settled_by_offsets().complete(_request(f"d{i}"))).status

        async with anyio.create_task_group() as tg:  # the tasks start in one pass
            for i in range(10):
                tg.start_soon(claim, i)
            for i in range(5):
                tg.start_soon(complete, i)
        store._db.conn.set_trace_callback(None)
    assert list(claims.values()) == ["claimed"] * 10
    assert list(completions.values()) == ["accepted"] * 5
    assert statements.count("COMMIT") == 1
    with contextlib.closing(sqlite3.connect(path)) as other:
        rows = other.execute(
            "SELECT job_key, max(fence, claimed_fence) FROM leaseworker_jobs"
        ).fetchall()
    assert sorted(rows) == sorted(
        [(f"c{i}", 2) for i in range(10)] + [(f"d{i}", 1) for i in range(5)]
    )


async def test_a_pass_runs_its_claims_and_completions_of_distinct_keys_in_few_statements(
    tmp_path: Path,
) -> None:
    """One multi-row statement per kind and 16 keys; a key touched twice runs alone, in order.

    Each answer is the one the call would get alone: claimed, duplicate,
    stale, accepted; the claim and completion of one key in the pass keep
    their order (the completion, at the claimed fence, is accepted).
    """
    path = tmp_path / "c.sqlite3"
    async with open_store(f"sqlite:///{path}") as store:
        assert isinstance(store, SqliteStore)
        for key in ("k0", "k2"):
            done = dataclasses.replace(_request(key), fence=5)
            assert (await store.complete(done)).status == "accepted"
        assert (await store.claim("k1", "v", 9)).status == "claimed"
        statements: list[str] = []
        store._db.conn.set_trace_callback(statements.append)
        claimed: dict[str, ClaimResult] = {}
        completed: dict[str, CompletionResult] = {}

        async def claim(key: str, fence: int, name: str) -> None:
            claimed[name] = await store.settled_by_offsets().claim(key, "v", fence)

        async def complete(key: str, fence: int, name: str) -> None:
            request = CompletionRequest(
                job_key=key, input_version="v", fence=fence, result={}, execution_id="e", pod="p"
            )
            completed[name] = await store.settled_by_offsets().complete(request)

        async with anyio.create_task_group() as tg:  # the tasks start in one pass
            for i in range(20):
                tg.start_soon(claim, f"a{i}", 2, f"a{i}")
            tg.start_soon(claim, "r", 4, "claim r")
            tg.start_soon(claim, "k0", 6, "claim k0")
            tg.start_soon(claim, "k2", 6, "claim k2")  # with the a-keys: a grouped duplicate
            tg.start_soon(complete, "k1", 3, "k1")
            for i in range(5):
                tg.start_soon(complete, f"d{i}", 1, f"d{i}")
            tg.start_soon(complete, "k0", 7, "complete k0")
            tg.start_soon(complete, "r", 4, "complete r")
        store._db.conn.set_trace_callback(None)
    status: dict[str, str] = {name: answer.status for name, answer in claimed.items()}
    status.update({name: answer.status for name, answer in completed.items()})
    assert status == {
        **{f"a{i}": "claimed" for i in range(20)},
        **{f"d{i}": "accepted" for i in range(5)},
        "claim r": "claimed",
        "complete r": "accepted",
        "claim k0": "duplicate",
        "claim k2": "duplicate",
        "complete k0": "duplicate",
        "k1": "stale",
    }
    assert completed["k1"].winning_fence == 9
    for name in ("claim k0", "claim k2"):
        standing = claimed[name].completion
        assert standing is not None
        assert (standing.job_key, standing.fence, standing.result) == (name[-2:], 5, {})
        assert claimed[name].highest_fence == 6
    assert claimed["a3"].highest_fence == 2
    assert statements.count("COMMIT") == 1
    # Distinct texts (the values bound): a trigger's firing is traced with its statement's text.
    claims = {sql for sql in statements if "claimed_fence = max(" in sql}
    records = {sql for sql in statements if "INSERT INTO leaseworker_completions" in sql}
    assert len(claims) == 2 + 2  # a0-a15, a16-a19 and k2; r and k0 alone
    assert len(records) == 1 + 2  # k1 and d0-d4; k0 and r alone


async def test_a_write_cancelled_before_its_pass_commits_is_not_written(tmp_path: Path) -> None:
    """A claim cancelled while it waits for its pass's commit leaves it; the others commit."""
    path = tmp_path / "c.sqlite3"
    async with open_store(f"sqlite:///{path}") as store:
        assert isinstance(store, SqliteStore)
        scope = anyio.CancelScope()
        answers = []

        async def cancelled() -> None:
            with scope:
                await store.settled_by_offsets().claim("gone", "v", 3)
            answers.append(str(scope.cancelled_caught))

        async def cancel_and_claim() -> None:  # in the same pass, after the first has queued
            scope.cancel()
            answers.append((await store.settled_by_offsets().claim("kept", "v", 3)).status)

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancelled)
            tg.start_soon(cancel_and_claim)
        assert sorted(answers) == ["True", "claimed"]
        assert (await store.claim("gone", "v", 1)).status == "claimed"  # no fence 3 stands
        assert (await store.claim("kept", "v", 1)).status == "stale"


async def test_the_relay_gets_no_message_before_its_transaction_is_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod's job transaction commits without waiting; the relay's claim of its message does.

    The claim answers only after an fsync that began after it, which covers
    the transaction committed before: no message leaves before its row lasts.
    """
    path = tmp_path / "c.sqlite3"
    async with open_store(f"sqlite:///{path}") as store:
        assert isinstance(store, SqliteStore)
        held = _HeldSync(store, monkeypatch)

        async def commit() -> None:
            async with store.settled_by_offsets().transaction("k", "v", 1) as tx:
                await tx.commit(_request("k"), [Message(topic="t", value=b"x")])

        with anyio.fail_after(5):
            await commit()
        assert held.asked == 0
        claims: list[list[OutboxRow]] = []

        async def claim() -> None:
            claims.append(await store.claim_outbox("relay", limit=10, hold=5.0))

        async with anyio.create_task_group() as tg:
            tg.start_soon(claim)
            await anyio.wait_all_tasks_blocked()
            assert (held.asked, claims) == (1, [])  # claimed, but not handed over unsynced
            held.released.set()
        assert [row.message.topic for row in claims[0]] == ["t"]


async def test_a_schema_7_file_migrates_to_key_ordered_tables_and_the_head_trigger(
    tmp_path: Path,
) -> None:
    """A file of schema 7 with a completion and a claim opens at schema 8, its rows kept.

    Both tables are rebuilt ``WITHOUT ROWID``; the old completion still answers
    ``duplicate``, the claim still fences lower fences out, and a new
    completion (one statement) moves the head through the trigger.
    """
    path = tmp_path / "c.sqlite3"
    url = parse_store_url(f"sqlite:///{path}")
    old = await SqliteStore.open(url, call_timeout=5.0, migrations=MIGRATIONS[:7])
    assert old.schema_version == 7
    await old.aclose()
    # What a pod of schema 7 left behind: a completion and its head, and a claim.
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute(
            "INSERT INTO leaseworker_jobs (job_key, fence, input_version, updated_at,"
            " claimed_fence) VALUES ('k', 1, 'v', 1, -1), ('c', -1, '', 1, 30)"
        )
        conn.execute(
            "INSERT INTO leaseworker_completions (job_key, input_version, fence, result,"
            " execution_id, pod, completed_at) VALUES ('k', 'v', 1, '{}', 'e', 'p', 1)"
        )
    new = await SqliteStore.open(url, call_timeout=5.0)
    try:
        assert new.schema_version == len(MIGRATIONS)  # 8 and later ones (PostgreSQL's)
        with contextlib.closing(sqlite3.connect(path)) as conn:
            tables = dict(conn.execute("SELECT name, sql FROM sqlite_schema WHERE type = 'table'"))
            triggers = conn.execute("SELECT name FROM sqlite_schema WHERE type = 'trigger'")
            assert [name for (name,) in triggers] == ["leaseworker_move_head"]
        for table in ("leaseworker_jobs", "leaseworker_completions"):
            assert tables[table].endswith("WITHOUT ROWID")
        assert not [name for name in tables if name.endswith("_new")]
        assert (await new.complete(_request("k"))).status == "duplicate"
        assert (await new.claim("c", "v2", 29)).status == "stale"
        later = CompletionRequest(
            job_key="k", input_version="v2", fence=2, result={"n": 2}, execution_id="e", pod="p"
        )
        assert (await new.complete(later)).status == "accepted"
        state = await new.state("k")
        assert state is not None
        assert (state.input_version, state.fence, state.result) == ("v2", 2, {"n": 2})
        stale = CompletionRequest(
            job_key="k", input_version="v3", fence=1, result={}, execution_id="e", pod="p"
        )
        assert (await new.complete(stale)).status == "stale"
    finally:
        await new.aclose()
