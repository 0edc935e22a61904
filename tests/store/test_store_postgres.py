"""PostgreSQL completion store when the server is unreachable, slow, locked or restarted.

Faults come from real conditions: a port nobody listens on, a stopped cluster, a
ChaosProxy that black-holes or cuts the traffic, a row lock held by another
session. Each call must end with StoreUnavailable within the store's
``call_timeout``, write nothing, and the store must work again afterwards.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable

import anyio
import psycopg
import pytest
from psycopg import sql

from leaseworker import CompletionRequest, CompletionStore, StoreUnavailable, open_store
from leaseworker._store import effect_store
from leaseworker._store._postgres import _pg_takeover
from leaseworker.testing import ChaosProxy
from leaseworker_dev._services import LocalPostgres, free_port

from ..waiting import eventually

TIMEOUT = 0.5
SLACK = 0.3  # scheduling and connection teardown on a busy CI machine


@pytest.fixture
def pg_url(postgres_server: LocalPostgres) -> str:
    """A fresh database of this test's own on the session cluster."""
    return postgres_server.create_database(f"t{uuid.uuid4().hex[:12]}")


@contextlib.asynccontextmanager
async def proxied(
    server: LocalPostgres, url: str
) -> AsyncIterator[tuple[ChaosProxy, CompletionStore]]:
    """A store on ``url`` whose traffic goes through a ChaosProxy, with a short call timeout.

    A context manager, not a fixture: the proxy's task group must be entered
    and left in the test's own task. The schema is migrated first, directly and
    with room: its dozens of statements are not what the short timeout is about.
    """
    async with open_store(url, call_timeout=5.0):
        pass
    async with ChaosProxy(server.port) as proxy:
        via_proxy = url.replace(f":{server.port}/", f":{proxy.port}/")
        async with open_store(via_proxy, call_timeout=TIMEOUT) as store:
            yield proxy, store


async def complete(store: CompletionStore, version: str, fence: int) -> str:
    """Complete job key ``k``; return the status."""
    result = await store.complete(
        CompletionRequest(
            job_key="k",
            input_version=version,
            fence=fence,
            result={"n": fence},
            execution_id="e",
            pod="p",
        )
    )
    return result.status


async def test_unreachable_port_fails_open_within_the_timeout(
    postgres_server: LocalPostgres,
) -> None:
    """Nobody listening: open_store raises StoreUnavailable in about call_timeout, no password."""
    url = f"postgresql://postgres:{postgres_server.password}@127.0.0.1:{free_port()}/leaseworker"
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as failed:
        async with open_store(url, call_timeout=TIMEOUT):
            pytest.fail("opened a store on a closed port")
    assert time.monotonic() - started < TIMEOUT + SLACK
    assert failed.value.key is None
    assert postgres_server.password not in str(failed.value)
    assert "***" in str(failed.value)


async def test_black_holed_server_fails_the_call_within_the_timeout(
    postgres_server: LocalPostgres, pg_url: str
) -> None:
    """A partition mid-operation: StoreUnavailable after call_timeout, nothing written.

    psycopg's own cancellation would wait for a cancel request the unreachable
    server never answers; the store instead shuts the socket down at the
    deadline. Once the partition heals the store works again.
    """
    async with proxied(postgres_server, pg_url) as (proxy, store):
        assert await complete(store, "v1", 1) == "accepted"
        proxy.blackhole = True
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="no answer within") as failed:
            await complete(store, "v2", 2)
        assert time.monotonic() - started < TIMEOUT + SLACK
        assert failed.value.key == "k"
        assert proxy.swallowed.is_set()
        proxy.blackhole = False
        assert await complete(store, "v3", 3) == "accepted"
    async with await psycopg.AsyncConnection.connect(pg_url) as direct:
        cur = await direct.execute("SELECT input_version FROM leaseworker_completions ORDER BY 1")
        assert await cur.fetchall() == [("v1",), ("v3",)]


async def test_dead_pooled_connections_are_replaced_without_an_error(
    postgres_server: LocalPostgres, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """After every connection was reset (a server restart), the next call still succeeds.

    The dead connection fails on its first round trip, before anything reached
    the server, so the store retries on a fresh one within the same deadline.
    """
    async with proxied(postgres_server, pg_url) as (proxy, store):
        assert await complete(store, "v1", 1) == "accepted"
        proxy.cut()
        with caplog.at_level(logging.INFO, logger="leaseworker.store"):
            assert await complete(store, "v2", 2) == "accepted"
        assert "pooled connection was dead" in caplog.text  # the retry path ran
        state = await store.state("k")
    assert state is not None
    assert state.input_version == "v2"


async def test_a_completion_whose_reply_was_lost_is_retried_and_reported_accepted(
    postgres_server: LocalPostgres, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The function committed but its reply never arrived (the connection was reset).

    The store retries on a fresh connection; the retry finds this call's own
    completion (same execution id and fence) and reports it ``accepted``, not
    ``duplicate``. Exactly one completion row exists.
    """
    async with ChaosProxy(postgres_server.port) as proxy:
        via_proxy = pg_url.replace(f":{postgres_server.port}/", f":{proxy.port}/")
        async with open_store(via_proxy, call_timeout=5.0) as store:
            assert await complete(store, "v1", 1) == "accepted"  # the pool holds a connection
            proxy.reply_delay = 30.0  # replies from now on are held back
            answers: list[str] = []
            answered = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(_answer, answers, answered, complete(store, "v2", 2))
                with anyio.fail_after(5):
                    # The marker is a row in the server's database: nothing to await.
                    while not await raw_rows(pg_url, "v2"):  # noqa: ASYNC110
                        await anyio.sleep(0.01)
                proxy.reply_delay = 0.0
                with caplog.at_level(logging.INFO, logger="leaseworker.store"):
                    proxy.cut()
                    with anyio.fail_after(5):
                        await answered.wait()
    assert answers == ["accepted"]
    assert "pooled connection was dead" in caplog.text
    assert await raw_rows(pg_url, "v2") == 1


async def _answer(answers: list[str], answered: anyio.Event, status: Awaitable[str]) -> None:
    answers.append(await status)
    answered.set()


async def raw_rows(url: str, version: str) -> int:
    """Count job ``k``'s completion rows of ``version`` over a direct connection."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        row = await (
            await conn.execute(
                "SELECT count(*) FROM leaseworker_completions"
                " WHERE job_key = 'k' AND input_version = %s",
                (version,),
            )
        ).fetchone()
    assert row is not None
    return int(row[0])


async def test_row_lock_held_elsewhere_bounds_the_call(pg_url: str) -> None:
    """A session holding the job key's head row: the call gives up at call_timeout.

    Nothing is written meanwhile; when the lock is released the same call is
    accepted, and the server-side statement timeout has ended the abandoned one.
    """
    async with open_store(pg_url, call_timeout=TIMEOUT) as store:
        assert await complete(store, "v1", 1) == "accepted"
        async with (
            await psycopg.AsyncConnection.connect(pg_url) as blocker,
            await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as watcher,
        ):
            await blocker.execute("SELECT 1 FROM leaseworker_jobs WHERE job_key = 'k' FOR UPDATE")
            started = time.monotonic()
            with pytest.raises(StoreUnavailable) as failed:
                await complete(store, "v2", 2)
            assert time.monotonic() - started < TIMEOUT + SLACK
            assert failed.value.key == "k"

            async def nobody_waits_for_the_lock() -> bool:
                cursor = await watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
                row = await cursor.fetchone()
                return row is not None and int(row[0]) == 0

            # The server ended the abandoned statement itself (statement_timeout):
            # otherwise it would still wait here, and write v2 once the lock goes.
            await eventually(nobody_waits_for_the_lock)
            await blocker.rollback()
        assert await store.lookup("k", "v2") is None
        assert await complete(store, "v2", 2) == "accepted"


async def test_read_committed_even_where_the_database_defaults_to_repeatable_read(
    pg_url: str,
) -> None:
    """A completion that waited for another session's lock on its job goes on afterwards.

    With the database's default set to REPEATABLE READ, a statement that waits
    for a row another transaction then changes fails with a serialisation
    error. The store's sessions use READ COMMITTED whatever the default (an
    autocommit connection ignores psycopg's own isolation setting).
    """
    database = psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"]
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
        await admin.execute(
            sql.SQL(
                "ALTER DATABASE {} SET default_transaction_isolation = 'repeatable read'"
            ).format(sql.Identifier(str(database)))
        )
    async with open_store(pg_url, call_timeout=5.0) as store:
        assert await complete(store, "v1", 1) == "accepted"
        answer: list[str] = []

        async def second() -> None:
            answer.append(await complete(store, "v2", 2))

        async with (
            await psycopg.AsyncConnection.connect(pg_url) as other,
            await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as watcher,
        ):

            async def waiting_for_the_lock() -> bool:
                cursor = await watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
                row = await cursor.fetchone()
                return row is not None and int(row[0]) >= 1

            # Another pod's transaction holds and changes the job's head row.
            await other.execute("UPDATE leaseworker_jobs SET fence = fence WHERE job_key = 'k'")
            async with anyio.create_task_group() as tg:
                tg.start_soon(second)
                await eventually(waiting_for_the_lock)
                await other.commit()
        assert answer == ["accepted"]


async def test_stopped_server_fails_calls_within_the_timeout() -> None:
    """The cluster stops under an open store: every call is StoreUnavailable within the bound."""
    server = LocalPostgres.start()
    try:
        async with open_store(server.url, call_timeout=TIMEOUT) as store:
            assert await complete(store, "v1", 1) == "accepted"
            server.stop()
            for call in range(2):
                started = time.monotonic()
                with pytest.raises(StoreUnavailable) as failed:
                    await complete(store, f"v{call + 2}", call + 2)
                assert time.monotonic() - started < TIMEOUT + SLACK
                assert server.password not in str(failed.value)
    finally:
        server.stop()


async def test_repr_and_errors_never_show_the_password(
    postgres_server: LocalPostgres, pg_url: str
) -> None:
    """The store's repr shows the URL with the password masked."""
    async with open_store(pg_url) as store:
        assert postgres_server.password not in repr(store)
        assert "postgres:***@" in repr(store)


def test_a_first_attempt_that_found_no_server_is_no_refusal_once_it_answers(
    postgres_server: LocalPostgres,
) -> None:
    """The first connection found no server; by the ping it is up: wait (not exit 2).

    As when a store outage heals while a pod starts: ``PQping`` answers OK after
    the failure, and only a second attempt tells the outage from a refusal.
    The same server refusing an unknown role stays permanent.
    """
    from leaseworker._store import parse_store_url
    from leaseworker._store._postgres import refusal

    database = f"t{uuid.uuid4().hex[:12]}"
    url = postgres_server.create_database(database)
    nobody = url.replace(f":{postgres_server.port}/", f":{free_port()}/")
    with pytest.raises(psycopg.OperationalError) as failed:
        psycopg.connect(nobody, connect_timeout=2).close()
    assert refusal(parse_store_url(url), failed.value, timeout=2) is None

    wrong = postgres_server.url_for(database, role="nosuchrole", password="not-it")
    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect(wrong, connect_timeout=2).close()
    reason = refusal(parse_store_url(wrong), refused.value, timeout=2)
    assert reason is not None
    assert "refused the connection after the password" in str(reason)


async def _sleeping(url: str, pid: int) -> bool:
    """Whether backend ``pid`` is inside ``pg_sleep``."""
    sql_text = "SELECT wait_event FROM pg_stat_activity WHERE pid = %s"
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        return await (await conn.execute(sql_text, (pid,))).fetchall() == [("PgSleep",)]


async def test_a_higher_fence_ends_the_older_transaction_holding_the_head_row(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A transaction at fence 10 sleeps in a statement (as a paused pod's would, unbounded).

    A claim at fence 5 (another pod's store) waits past ``LOOK_AFTER`` and
    leaves it alone: it times out. A claim at fence 20 ends its session
    (it is marked with the key and fence 10) and is answered ``claimed``
    long before the statement's 30 s; the older transaction's statement
    fails, and its commit writes nothing.
    """
    caplog.set_level(logging.INFO, logger="leaseworker.store")
    async with (
        open_store(pg_url, call_timeout=10.0) as older,
        open_store(pg_url, call_timeout=2 * _pg_takeover.LOOK_AFTER + 0.3) as newer,
    ):
        failed: list[BaseException] = []
        async with effect_store(older).transaction("k", "v1", 10) as tx:
            pid = tx.connection.info.backend_pid
            async with anyio.create_task_group() as tg:

                async def sleep() -> None:
                    with pytest.raises(StoreUnavailable) as ended:
                        await tx.execute("SELECT pg_sleep(30)")
                    failed.append(ended.value)

                tg.start_soon(sleep)
                await eventually(lambda: _sleeping(pg_url, pid))
                with pytest.raises(StoreUnavailable):
                    await newer.claim("k", "v1", 5)
                assert await _sleeping(pg_url, pid)
                started = time.monotonic()
                assert (await newer.claim("k", "v1", 20)).status == "claimed"
                assert time.monotonic() - started < 5.0
            assert "AdminShutdown" in str(failed[0])
            with pytest.raises(StoreUnavailable):
                request = CompletionRequest(
                    job_key="k", input_version="v1", fence=10, result=1, execution_id="e", pod="p"
                )
                await tx.commit(request, [])
        assert await older.lookup("k", "v1") is None
    assert "ended the session of an older execution (fence 10)" in caplog.text


async def test_a_holder_this_role_may_not_see_is_waited_for_with_one_log_line(
    postgres_server: LocalPostgres, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The older transaction is the superuser's; the newer claim's role may not see its state.

    So it cannot tell a commit from a stuck statement: the claim waits as
    before (its call times out), and says why once.
    """
    database = pg_url.rsplit("/", 1)[1]
    role = f"r{uuid.uuid4().hex[:10]}"
    postgres_server.create_role(role, password="pw")
    async with open_store(pg_url, call_timeout=10.0) as older:
        for grant in (
            "GRANT ALL ON ALL TABLES IN SCHEMA public TO {}",
            "GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {}",
            "GRANT USAGE, CREATE ON SCHEMA public TO {}",
        ):
            postgres_server.execute(sql.SQL(grant).format(sql.Identifier(role)), database=database)
        caplog.set_level(logging.INFO, logger="leaseworker.store")
        url = postgres_server.url_for(database, role=role, password="pw")
        async with (
            open_store(url, call_timeout=4 * _pg_takeover.LOOK_AFTER + 0.3) as newer,
            effect_store(older).transaction("k", "v1", 10),
        ):
            with pytest.raises(StoreUnavailable):
                await newer.claim("k", "v1", 20)
    assert caplog.text.count("this role may not see whether it is committing") == 1
