"""The PostgreSQL completion store: psycopg 3, async, over a connection pool.

Each completion is one call of the ``leaseworker_complete()`` server function,
and each claim one of ``leaseworker_claim()``: both lock the job key's head
row, then read and write in their own transaction; every call has one
deadline. Why that order is race-free, and the bounds: see
docs/design.md#the-postgresql-store.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import TypeVar, final

import anyio
import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from .._errors import StoreUnavailable
from ._model import (
    ClaimResult,
    Completion,
    CompletionRequest,
    CompletionResult,
    answer_to,
    check_call,
    completion_params,
)
from ._schema import ADVISORY_LOCK_KEY, MIGRATIONS, Migration, pending
from ._url import StoreURL

logger = logging.getLogger("leaseworker.store")

_T = TypeVar("_T")
_Conn = psycopg.AsyncConnection[TupleRow]

_COMPLETE = """
    SELECT * FROM leaseworker_complete(
        %(job_key)s, %(input_version)s, %(fence)s::bigint, %(result)s::jsonb,
        %(execution_id)s, %(pod)s
    )
"""
_CLAIM = """
    SELECT * FROM leaseworker_claim(%(job_key)s, %(input_version)s, %(fence)s::bigint)
"""
_FIND = """
    SELECT input_version, fence, result, execution_id, pod, completed_at
    FROM leaseworker_completions WHERE job_key = %s AND input_version = %s
"""
_STATE = """
    SELECT c.input_version, c.fence, c.result, c.execution_id, c.pod, c.completed_at
    FROM leaseworker_jobs j
    JOIN leaseworker_completions c
      ON c.job_key = j.job_key AND c.input_version = j.input_version
    WHERE j.job_key = %s
"""
_VERSION_TABLE = """
    CREATE TABLE IF NOT EXISTS leaseworker_schema_version (
        version     integer PRIMARY KEY,
        description text NOT NULL,
        applied_at  timestamptz NOT NULL DEFAULT now()
    )
"""


@final
class PostgresStore:
    """Completions in PostgreSQL; open it with ``open_store("postgresql://...")``.

    ``call_timeout`` bounds every call (pool checkout included); ``max_connections``
    caps the pool. ``schema_version`` is the database's schema version after
    the start-up migration.
    """

    def __init__(
        self, pool: AsyncConnectionPool[_Conn], *, shown_url: str, call_timeout: float
    ) -> None:
        self._pool = pool
        self._shown_url = shown_url
        self._timeout = call_timeout
        self.schema_version = 0

    @classmethod
    async def open(
        cls,
        url: StoreURL,
        *,
        call_timeout: float,
        max_connections: int = 10,
        migrations: Sequence[Migration] = MIGRATIONS,
    ) -> PostgresStore:
        """Connect, then create or migrate the schema; raise StoreUnavailable on failure."""
        pool: AsyncConnectionPool[_Conn] = AsyncConnectionPool(
            url.target,
            open=False,
            min_size=1,
            max_size=max_connections,
            name="leaseworker-completions",
            timeout=call_timeout,
            kwargs={"autocommit": True, "connect_timeout": max(2, math.ceil(call_timeout))},
            configure=_SessionSetup(call_timeout),
        )
        store = cls(pool, shown_url=url.redacted, call_timeout=call_timeout)
        try:
            try:
                await pool.open(wait=True, timeout=call_timeout)
            except psycopg.Error as exc:
                raise StoreUnavailable(
                    None, f"cannot connect to {url.redacted} within {call_timeout}s"
                ) from exc
            store.schema_version = await store._run(
                None, lambda conn, attempt: _migrate(conn, migrations)
            )
        except BaseException:
            with anyio.CancelScope(shield=True):
                await pool.close(timeout=call_timeout)
            raise
        return store

    async def complete(self, request: CompletionRequest) -> CompletionResult:
        """Record a completion if the fence allows; see ``CompletionStore.complete``."""
        params = completion_params(request)

        async def attempt_once(conn: _Conn, attempt: _Attempt) -> CompletionResult:
            row = await (await conn.execute(_COMPLETE, params)).fetchone()
            assert row is not None  # the function returns one row on every path
            status, winning, *standing = row
            answer = answer_to(
                request,
                status,
                winning_fence=winning,
                completion=_maybe_completion(request.job_key, tuple(standing)),
            )
            if attempt.retry and _own_landed(answer, request.execution_id):
                return dataclasses.replace(answer, status="accepted")
            return answer

        return await self._run(request.job_key, attempt_once)

    async def claim(self, job_key: str, input_version: str, fence: int) -> ClaimResult:
        """Raise the job key's claimed fence to ``fence``; see ``CompletionStore.claim``.

        Retrying after a dead connection is safe: a claim that landed twice
        is one claim (``greatest``), and the answer reads what stands.
        """
        check_call(job_key, fence, input_version)
        params = {"job_key": job_key, "input_version": input_version, "fence": fence}

        async def attempt_once(conn: _Conn, attempt: _Attempt) -> ClaimResult:
            row = await (await conn.execute(_CLAIM, params)).fetchone()
            assert row is not None  # the function returns one row on every path
            status, highest, *standing = row
            return ClaimResult(
                status=status,
                job_key=job_key,
                input_version=input_version,
                fence=fence,
                highest_fence=highest,
                completion=_maybe_completion(job_key, tuple(standing)),
            )

        return await self._run(job_key, attempt_once)

    async def lookup(self, job_key: str, input_version: str) -> Completion | None:
        """Return this identity's completion, or ``None``."""
        check_call(job_key, 0, input_version)

        async def read(conn: _Conn, attempt: _Attempt) -> Completion | None:
            return await _find(conn, job_key, input_version)

        return await self._run(job_key, read)

    async def state(self, job_key: str) -> Completion | None:
        """Return the job key's winning completion, or ``None``."""
        check_call(job_key, 0)

        async def read(conn: _Conn, attempt: _Attempt) -> Completion | None:
            row = await (await conn.execute(_STATE, (job_key,))).fetchone()
            return None if row is None else _completion(job_key, row)

        return await self._run(job_key, read)

    async def aclose(self) -> None:
        """Close the pool (waiting up to ``call_timeout`` for connections in use)."""
        await self._pool.close(timeout=self._timeout)

    def __repr__(self) -> str:
        return f"PostgresStore(url={self._shown_url!r}, call_timeout={self._timeout})"

    async def _run(self, key: str | None, op: Callable[[_Conn, _Attempt], Awaitable[_T]]) -> _T:
        """Run ``op`` on a pooled connection under one deadline; translate failures."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        retry = False
        while True:
            attempt = _Attempt(retry=retry)
            try:
                async with self._pool.connection(
                    timeout=max(deadline - loop.time(), 0.001)
                ) as conn:
                    timer = loop.call_at(deadline, attempt.sever, conn)
                    try:
                        return await op(conn, attempt)
                    except psycopg.OperationalError:
                        attempt.dead = conn.broken or conn.closed
                        raise
                    finally:
                        timer.cancel()
            except (PoolTimeout, PoolClosed) as exc:
                raise StoreUnavailable(key, self._describe(exc, attempt)) from exc
            except psycopg.OperationalError as exc:
                if attempt.expired or not attempt.dead:  # a live connection's error stands
                    raise StoreUnavailable(key, self._describe(exc, attempt)) from exc
                if loop.time() >= deadline:
                    raise StoreUnavailable(key, self._describe(exc, attempt)) from exc
                logger.info(
                    "completion store: pooled connection was dead (%s); retrying on another",
                    type(exc).__name__,
                )
                retry = True
            except psycopg.Error as exc:
                raise StoreUnavailable(key, self._describe(exc, attempt)) from exc

    def _describe(self, exc: psycopg.Error, attempt: _Attempt) -> str:
        if attempt.expired:
            return f"no answer within {self._timeout}s"
        if isinstance(exc, PoolTimeout):
            return f"no connection to {self._shown_url} within {self._timeout}s"
        if isinstance(exc, PoolClosed):
            return "the store is closed"
        # First line only: later lines (DETAIL, CONTEXT) may quote row values.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        state = f" [{exc.sqlstate}]" if exc.sqlstate else ""
        return f"{type(exc).__name__}{state}: {first}"


@dataclass(slots=True)
class _Attempt:
    """What one try of a call got to: decides whether retrying is safe."""

    retry: bool = False  # an earlier try of the same call failed on a dead connection
    dead: bool = False  # the pooled connection turned out to be broken
    expired: bool = False

    def sever(self, conn: _Conn) -> None:
        """Deadline passed: shut the socket down so the pending read fails at once.

        ``shutdown`` on a duplicate descriptor affects the shared socket but
        leaves psycopg's own descriptor open, so its number cannot be reused
        under it before psycopg notices and closes the connection.
        """
        self.expired = True
        try:
            fd = conn.pgconn.socket
            with socket.socket(fileno=os.dup(fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        except (OSError, psycopg.Error):
            pass  # already closed: the pending call fails anyway


@final
class _SessionSetup:
    """Pool ``configure`` hook, once per new connection.

    READ COMMITTED is set explicitly because the race-freedom argument above
    relies on a fresh snapshot per statement (a server, database or URL
    default of REPEATABLE READ would turn lock waits into serialisation
    failures). Set twice: psycopg's setting for the transactions it begins
    (``conn.transaction()``), and the session's default for the single
    statements an autocommit connection runs, which psycopg's setting does not
    reach. The server-side timeouts equal the store's bound.
    """

    def __init__(self, call_timeout: float) -> None:
        self._ms = f"{max(1, math.ceil(call_timeout * 1000))}ms"

    async def __call__(self, conn: _Conn) -> None:
        await conn.set_isolation_level(psycopg.IsolationLevel.READ_COMMITTED)
        await conn.execute(
            "SELECT set_config('default_transaction_isolation', 'read committed', false),"
            " set_config('statement_timeout', %s, false),"
            " set_config('idle_in_transaction_session_timeout', %s, false)",
            (self._ms, self._ms),
        )


def _own_landed(answer: CompletionResult, execution_id: str) -> bool:
    """Whether ``answer`` (to a retry) shows the earlier, lost attempt of this call committed."""
    return (
        answer.status == "duplicate"
        and answer.completion is not None
        and answer.completion.execution_id == execution_id
        and answer.completion.fence == answer.fence
    )


async def _find(conn: _Conn, job_key: str, input_version: str) -> Completion | None:
    row = await (await conn.execute(_FIND, (job_key, input_version))).fetchone()
    return None if row is None else _completion(job_key, row)


def _maybe_completion(job_key: str, row: TupleRow) -> Completion | None:
    """Return the completion in ``row``, or ``None`` where an outer join found none."""
    return None if row[-1] is None else _completion(job_key, row)


def _completion(job_key: str, row: TupleRow) -> Completion:
    input_version, fence, result, execution_id, pod, completed_at = row
    return Completion(
        job_key=job_key,
        input_version=input_version,
        fence=fence,
        result=result,
        execution_id=execution_id,
        pod=pod,
        completed_at=completed_at.astimezone(UTC),  # the session's TimeZone may be anything
    )


async def _migrate(conn: _Conn, migrations: Sequence[Migration]) -> int:
    """Apply missing migrations under a transaction-scoped advisory lock; return the version."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK_KEY,))
        await conn.execute(_VERSION_TABLE)
        row = await (
            await conn.execute("SELECT coalesce(max(version), 0) FROM leaseworker_schema_version")
        ).fetchone()
        applied = int(row[0]) if row is not None else 0
        for migration in pending(applied, migrations):
            for statement in migration.postgresql:
                await conn.execute(statement)
            await conn.execute(
                "INSERT INTO leaseworker_schema_version (version, description) VALUES (%s, %s)",
                (migration.version, migration.description),
            )
            logger.info(
                "completion store: applied schema version %d (%s)",
                migration.version,
                migration.description,
            )
    return max([applied, *(m.version for m in migrations)])
