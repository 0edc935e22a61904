"""A store that fails inside ``ctx.transaction()``, and the lease as the transaction's budget.

Real Redis, real PostgreSQL (the session's server, or one of the test's own
to restart) and SQLite files. A session the server ends inside the block
(``pg_terminate_backend`` from a second connection), a server restart
inside the block, a commit the database refuses: each ends the execution
``lost (store_unavailable)`` and the trigger runs again and completes once
(on the code before the executor's fix they ended ``failed`` and the
trigger was lost). A commit that landed but whose answer was lost is
answered ``duplicate``. The budget: a statement longer than
``--store-timeout`` commits while the lease holds (before: ended at the
store's timeout), and with no pod acting at all the server ends a
statement, or an idle transaction, when the lease's validity runs out, so
the head row's lock is free again.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from redis.asyncio import Redis

from leaseworker import (
    Backoff,
    CompletionStore,
    JobContext,
    RedisLeases,
    ReportJob,
    StoreUnavailable,
    open_store,
)
from leaseworker._events import Event, ExecutionEvent, LeaseEvent
from leaseworker._execution import Ending, Executor, completion_key
from leaseworker._store import StoreTransaction, effect_store
from leaseworker.testing import make_trigger
from leaseworker_dev._services import LocalPostgres

from ..store.test_store import raw
from ..waiting import eventually

KEY = "report:acme:2026-11"
TABLE = "CREATE TABLE report (k text NOT NULL, fence bigint NOT NULL)"


class GatedJob(ReportJob):
    """Writes one row in its transaction; its first run waits inside the block for ``go``.

    ``then``: the statement the first run sends after the gate (``None``: none,
    the commit comes next). ``sleep``: a statement every run sends first.
    """

    topic = "reports.requested"
    lease_duration = 5.0

    def __init__(self, url: str, *, then: str | None = "SELECT 1", sleep: str = "") -> None:
        self.sql = "INSERT INTO report (k, fence) VALUES (%s, %s)"
        if url.startswith("sqlite"):
            self.sql = self.sql.replace("%s", "?")
        self.then, self.sleep = then, sleep
        self.runs = 0
        self.gated = False
        self.inside = anyio.Event()
        self.go = anyio.Event()
        self.backend_pid = 0

    async def run(self, ctx: JobContext) -> object:
        """Write, maybe wait at the gate (first run), publish, complete: one transaction."""
        self.runs += 1
        async with ctx.transaction() as tx:
            if self.sleep:
                await tx.execute(self.sleep)
            await tx.execute(self.sql, (ctx.job_key, ctx.fence))
            if self.gated and self.runs == 1:
                if isinstance(tx.connection, psycopg.AsyncConnection):
                    self.backend_pid = tx.connection.info.backend_pid
                self.inside.set()
                await self.go.wait()
                if self.then is not None:
                    await tx.execute(self.then)
            tx.publish("reports.ready", {"fence": ctx.fence})
            tx.complete({"fence": ctx.fence})
        return None


class Events:
    """Keeps each execution's ``finished`` outcome and reason."""

    def __init__(self) -> None:
        self.finished: list[tuple[str | None, str | None]] = []
        self.errors: list[str] = []

    def __call__(self, event: Event) -> None:
        """Keep a ``finished`` event's outcome and reason."""
        if isinstance(event, ExecutionEvent) and event.event == "finished":
            self.finished.append((event.outcome, event.reason))
            self.errors.append(str(event.error))


def executor(
    job: ReportJob, leases: RedisLeases, store: CompletionStore, ns: str, events: Events
) -> Executor:
    """The pod's executor on real Redis and ``store``, retrying a loss at once."""
    retry = Backoff(initial=0.05, cap=0.2)
    return Executor(
        job, leases, pod="pod-a", store=store, store_namespace=ns, hooks=[events], lost_retry=retry
    )


async def run_gated(
    executor: Executor, job: GatedJob, fault: Callable[[], Awaitable[None]]
) -> Ending:
    """Run the trigger; inject ``fault`` while its first run waits inside the block."""
    job.gated = True
    ending: list[Ending] = []

    async def run() -> None:
        ending.append(await executor.run(make_trigger({"tenant": "acme"}, key=KEY), KEY))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await job.inside.wait()
            await fault()
            job.go.set()
    return ending[0]


async def committed_once(url: str, ns: str) -> None:
    """Exactly one row, one completion and one outbox message were written."""
    assert len(await raw(url, "SELECT k FROM report")) == 1
    assert len(await raw(url, "SELECT job_key FROM leaseworker_completions")) == 1
    outbox = await raw(url, "SELECT job_key FROM leaseworker_outbox")
    assert outbox == [(completion_key(ns, KEY),)]


@pytest.fixture
def pg_url(postgres_server: LocalPostgres) -> str:
    """A fresh database of the session's PostgreSQL with the job's table."""
    url = postgres_server.create_database(f"t{uuid.uuid4().hex[:12]}")
    with psycopg.connect(url) as conn:
        conn.execute(TABLE)
    return url


@pytest.fixture
def own_postgres(tmp_path: Path) -> Iterator[LocalPostgres]:
    """A PostgreSQL server of this test's own, to restart."""
    server = LocalPostgres.start()
    try:
        yield server
    finally:
        server.stop()


async def test_a_session_the_server_ends_inside_the_block_is_lost_and_retried(
    pg_url: str, leases: RedisLeases, namespace: str
) -> None:
    """``pg_terminate_backend`` inside the block: ``lost``, then one completion."""
    job, events = GatedJob(pg_url), Events()
    async with open_store(pg_url) as store:

        async def terminate() -> None:
            rows = await raw(pg_url, "SELECT pg_terminate_backend(%s)", (job.backend_pid,))
            assert rows == [(True,)]

        ending = await run_gated(executor(job, leases, store, namespace, events), job, terminate)
    assert ending == Ending("completed")
    assert events.finished == [("lost", "store_unavailable"), ("completed", None)]
    await committed_once(pg_url, namespace)


async def test_a_server_restart_inside_the_block_is_lost_and_retried(
    own_postgres: LocalPostgres, leases: RedisLeases, namespace: str
) -> None:
    """The server restarts while the block waits: ``lost``, then one completion after it."""
    url = own_postgres.url
    await raw(url, TABLE)
    job, events = GatedJob(url, then=None), Events()  # the commit meets the new server
    async with open_store(url) as store:

        async def restart() -> None:
            await anyio.to_thread.run_sync(own_postgres.restart)

        ending = await run_gated(executor(job, leases, store, namespace, events), job, restart)
    assert ending == Ending("completed")
    assert events.finished[0] == ("lost", "store_unavailable")
    assert events.finished[-1] == ("completed", None)
    await committed_once(url, namespace)


@pytest.fixture
async def refusing(store_url: str) -> AsyncIterator[tuple[CompletionStore, str]]:
    """A store whose database refuses the first commit of a completion, then accepts."""
    await raw(store_url, TABLE)
    async with open_store(store_url) as opened:  # the schema exists from here on
        if store_url.startswith("sqlite"):
            await raw(store_url, "CREATE TABLE refuse (n integer)")
            await raw(store_url, "INSERT INTO refuse VALUES (1)")
            await raw(
                store_url,
                "CREATE TRIGGER refuse_once BEFORE INSERT ON leaseworker_completions"
                " WHEN (SELECT count(*) FROM refuse) > 0"
                " BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
            )
        else:  # a sequence is not rolled back: the first commit only
            await raw(store_url, "CREATE SEQUENCE refuse")
            await raw(
                store_url,
                "CREATE FUNCTION refuse_once() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                " IF nextval('refuse') = 1 THEN PERFORM pg_terminate_backend(pg_backend_pid());"
                " END IF; RETURN NEW; END $$",
            )
            await raw(
                store_url,
                "CREATE TRIGGER refuse_once BEFORE INSERT ON leaseworker_completions"
                " FOR EACH ROW EXECUTE FUNCTION refuse_once()",
            )
        yield opened, store_url


async def test_a_commit_the_database_refuses_is_lost_and_retried(
    refusing: tuple[CompletionStore, str], leases: RedisLeases, namespace: str
) -> None:
    """The commit fails (PostgreSQL: the session ends in it; SQLite: an abort): retried once."""
    store, url = refusing
    job, events = GatedJob(url), Events()
    sqlite = url.startswith("sqlite")

    def allow(event: Event) -> None:  # SQLite: the refusal is lifted once it happened
        if sqlite and isinstance(event, ExecutionEvent) and event.event == "finished":
            path = url.removeprefix("sqlite:///")
            with contextlib.closing(sqlite3.connect(path, timeout=5)) as conn, conn:
                conn.execute("DELETE FROM refuse")

    retry = Backoff(initial=0.05, cap=0.2)
    run = Executor(
        job,
        leases,
        pod="pod-a",
        store=store,
        store_namespace=namespace,
        hooks=[events, allow],
        lost_retry=retry,
    )
    with anyio.fail_after(60):
        ending = await run.run(make_trigger({"tenant": "acme"}, key=KEY), KEY)
    assert ending == Ending("completed")
    assert events.finished == [("lost", "store_unavailable"), ("completed", None)]
    assert job.runs == 2
    await committed_once(url, namespace)


class _AnswerLost:
    """A store whose first transaction commits, then loses the answer (the connection died)."""

    def __init__(self, inner: CompletionStore) -> None:
        self.inner = inner
        self.lost = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @contextlib.asynccontextmanager
    async def transaction(
        self, job_key: str, input_version: str, fence: int, **budget: Any
    ) -> AsyncIterator[StoreTransaction]:
        """The inner store's transaction; its first commit loses its answer."""
        inner = effect_store(self.inner)
        async with inner.transaction(job_key, input_version, fence, **budget) as tx:
            yield _LosesAnswer(tx, self) if not self.lost else tx


class _LosesAnswer:
    def __init__(self, tx: StoreTransaction, store: _AnswerLost) -> None:
        self._tx, self._store = tx, store
        self.opened, self.statements = tx.opened, tx.statements
        self.hold_limit = tx.hold_limit

    @property
    def connection(self) -> Any:
        return self._tx.connection

    async def execute(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        return await self._tx.execute(sql, params)

    async def commit(self, request: Any, messages: Any) -> Any:
        answer = await self._tx.commit(request, messages)
        assert answer.status == "accepted"
        self._store.lost += 1
        raise StoreUnavailable(request.job_key, "injected: the commit's answer was lost")


async def test_a_commit_that_landed_but_lost_its_answer_is_answered_duplicate(
    store_url: str, leases: RedisLeases, namespace: str
) -> None:
    """The retry finds the identity completed: ``duplicate``, nothing written twice."""
    await raw(store_url, TABLE)
    job, events = GatedJob(store_url), Events()
    async with open_store(store_url) as opened:
        store = _AnswerLost(opened)
        run = executor(job, leases, store, namespace, events)
        with anyio.fail_after(60):
            ending = await run.run(make_trigger({"tenant": "acme"}, key=KEY), KEY)
    assert ending == Ending("duplicate")
    assert events.finished == [("lost", "store_unavailable"), ("duplicate", None)]
    assert (store.lost, job.runs) == (1, 1)
    await committed_once(store_url, namespace)


async def test_a_statement_longer_than_the_store_timeout_commits_while_the_lease_holds(
    pg_url: str, leases: RedisLeases, namespace: str
) -> None:
    """A 1.5 s statement, a 0.5 s store timeout, a 5 s lease: committed (before: lost)."""
    job, events = GatedJob(pg_url, sleep="SELECT pg_sleep(1.5)"), Events()
    async with open_store(pg_url, call_timeout=0.5) as store:
        with anyio.fail_after(30):
            ending = await executor(job, leases, store, namespace, events).run(
                make_trigger({"tenant": "acme"}, key=KEY), KEY
            )
    assert ending == Ending("completed")
    assert events.finished == [("completed", None)]
    await committed_once(pg_url, namespace)


async def _activity(url: str, pid: int) -> list[tuple[Any, ...]]:
    """The state and wait event of backend ``pid`` (``[]``: no such backend)."""
    sql = "SELECT state, wait_event FROM pg_stat_activity WHERE pid = %s"
    return await raw(url, sql, (pid,))


async def _lock_free(url: str, namespace: str = "ns") -> bool:
    """Whether the job key's head row can be locked now (no transaction holds it)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        try:
            await conn.execute(
                "SELECT 1 FROM leaseworker_jobs WHERE job_key = %s FOR UPDATE NOWAIT",
                (completion_key(namespace, KEY),),
            )
        except psycopg.errors.LockNotAvailable:
            return False
        return True


async def test_the_server_ends_an_idle_transaction_when_the_lease_budget_runs_out(
    pg_url: str,
) -> None:
    """Nothing of the pod acts between statements (as if paused): the server frees the head row.

    The budget is 1 s, the store's timeout 10 s: the lock is free after about
    1 s (``idle_in_transaction_session_timeout``), long before 10 s.
    """
    async with open_store(pg_url, call_timeout=10.0) as store:
        await store.claim(completion_key("ns", KEY), "v1", 7)
        deadline = time.monotonic() + 1.0
        begun = time.monotonic()
        async with effect_store(store).transaction(
            completion_key("ns", KEY), "v1", 7, budget=lambda: deadline - time.monotonic()
        ) as tx:
            assert not await _lock_free(pg_url)
            await tx.execute("SELECT 1")
            await anyio.sleep(max(0.0, deadline - time.monotonic()) + 0.3)
            assert await _lock_free(pg_url)
            assert time.monotonic() - begun < 3.0


class LongStatementJob(ReportJob):
    """Its first run sends one long statement in its transaction (``sleep``), then writes its row.

    A 3 s lease renewed every 0.5 s; ``inside`` is set as the statement is
    sent; ``took`` is how long the statement ran, or ran until it was ended.
    """

    topic = "reports.requested"
    lease_duration = 3.0
    renewal_interval = 0.5

    def __init__(self, sleep: float) -> None:
        self.sleep = sleep
        self.runs = 0
        self.inside = anyio.Event()
        self.took = 0.0
        self.backend_pid = 0

    async def run(self, ctx: JobContext) -> object:
        """The long statement (first run only), the row, the completion: one transaction."""
        self.runs += 1
        async with ctx.transaction() as tx:
            if self.runs == 1:
                assert isinstance(tx.connection, psycopg.AsyncConnection)
                self.backend_pid = tx.connection.info.backend_pid
                self.inside.set()
                begun = time.monotonic()
                try:
                    await tx.execute("SELECT pg_sleep(%s)", (self.sleep,))
                finally:
                    self.took = time.monotonic() - begun
            await tx.execute(
                "INSERT INTO report (k, fence) VALUES (%s, %s)", (ctx.job_key, ctx.fence)
            )
            tx.complete({"fence": ctx.fence})
        return None


async def test_a_statement_longer_than_the_lease_commits_while_the_lease_renews(
    pg_url: str, leases: RedisLeases, namespace: str
) -> None:
    """A 5 s statement on a 3 s lease that renews commits once (before: ended at 3 s, lost)."""
    job, events = LongStatementJob(sleep=5.0), Events()
    renewed: list[LeaseEvent] = []

    def renewals(event: Event) -> None:
        if isinstance(event, LeaseEvent) and event.name == "renewed":
            renewed.append(event)

    async with open_store(pg_url, call_timeout=1.0) as store:
        run = Executor(
            job,
            leases,
            pod="pod-a",
            store=store,
            store_namespace=namespace,
            hooks=[events, renewals],
        )
        with anyio.fail_after(30):
            ending = await run.run(make_trigger({"tenant": "acme"}, key=KEY), KEY)
    assert ending == Ending("completed")
    assert events.finished == [("completed", None)]
    assert job.took >= 5.0
    assert len(renewed) >= 5  # the lease was renewed all along the statement
    assert len(await raw(pg_url, "SELECT k FROM report")) == 1


async def test_a_statement_whose_lease_is_lost_is_ended_by_the_pod_and_commits_nothing(
    pg_url: str, leases: RedisLeases, redis: Redis, namespace: str
) -> None:
    """A lease lost in a 30 s statement: the pod ends it on the server, then ends ``lost``.

    The lease's key is deleted while the statement runs; the next renewal is
    rejected. Right then no statement of it runs, its session is alive and idle (reused,
    not left dirty), the head row is free and nothing was written. Before the
    pod ended it itself, psycopg's interrupted cancel closed the connection and
    the server slept on, holding the row.
    """
    job, events = LongStatementJob(sleep=30.0), Events()
    async with open_store(pg_url, call_timeout=1.0) as store:
        run = Executor(
            job,
            leases,
            pod="pod-a",
            store=store,
            store_namespace=namespace,
            hooks=[events],
            loss_budget=1,
        )
        ending: list[Ending] = []

        async def one() -> None:
            ending.append(await run.run(make_trigger({"tenant": "acme"}, key=KEY), KEY))

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(one)
                await job.inside.wait()

                async def sleeping() -> bool:
                    return await _activity(pg_url, job.backend_pid) == [("active", "PgSleep")]

                await eventually(sleeping)
                assert await redis.delete(leases.lease_key(KEY)) == 1
        assert await _activity(pg_url, job.backend_pid) == [("idle", "ClientRead")]
        assert await _lock_free(pg_url, namespace)
    assert (ending[0].outcome, ending[0].loss_reason) == ("lost", "rejected")
    assert job.took < 3.0
    assert await raw(pg_url, "SELECT k FROM report") == []
    assert await raw(pg_url, "SELECT job_key FROM leaseworker_completions") == []


class SleepyJob(ReportJob):
    """Sleeps ``block`` seconds inside its transaction (payload), then writes its row."""

    topic = "reports.requested"
    lease_duration = 30.0

    def __init__(self) -> None:
        self.inside = anyio.Event()

    async def run(self, ctx: JobContext) -> object:
        """Sleep in the block as the payload says, then write and complete."""
        async with ctx.transaction() as tx:
            block = float(ctx.trigger.payload.get("block", 0))
            if block:
                self.inside.set()
                await anyio.sleep(block)
            sql = "INSERT INTO report (k, fence) VALUES (?, ?)"
            await tx.execute(sql, (ctx.job_key, ctx.fence))
            tx.complete({"fence": ctx.fence})
        return None


async def test_a_sqlite_block_past_its_bound_is_refused_and_the_pods_other_executions_go_on(
    tmp_path: Path, leases: RedisLeases, namespace: str
) -> None:
    """A 20 s block on SQLite (1 s store timeout) is stopped at 0.5 s, ``failed``, nothing written.

    Another key's execution, started while it holds the file, completes within
    the bound (before: it waited behind the block, its claim failed after the
    store's 1 s and it was retried until the block ended).
    """
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    await raw(url, TABLE)
    job, events = SleepyJob(), Events()
    async with open_store(url, call_timeout=1.0) as store:
        run = executor(job, leases, store, namespace, events)
        endings: dict[str, tuple[Ending, float]] = {}

        async def one(key: str, block: float) -> None:
            begun = time.monotonic()
            ending = await run.run(make_trigger({"block": block}, key=key), key)
            endings[key] = (ending, time.monotonic() - begun)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(one, "report:long", 20.0)
                await job.inside.wait()
                tg.start_soon(one, "report:other", 0.0)
    long, long_took = endings["report:long"]
    other, other_took = endings["report:other"]
    assert (long.outcome, long.error_type) == ("failed", "RuntimeError")
    assert any("was stopped after 0.5s" in error for error in events.errors)
    assert long_took < 2.0
    assert other == Ending("completed")
    assert other_took < 1.0
    assert await raw(url, "SELECT k FROM report") == [("report:other",)]
