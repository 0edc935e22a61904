"""PostgreSQL's transactions for jobs and its outbox.

A job's transaction takes a pooled connection of its own, begins, locks the
job key's head row (the lock every claim and completion of the key takes)
and reads the identity after the lock, as ``leaseworker_complete()`` does;
its commit calls that same function, then inserts the messages, in the same
transaction. It locks one head row and waits for no batch, so it cannot
close a cycle with the batches' key-ordered locks (docs/design.md).
Relays claim rows with ``FOR UPDATE SKIP LOCKED``. See docs/effects.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any, final

import anyio
import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import PoolClosed, PoolTimeout

from .._errors import StoreUnavailable
from ._effects import Message, OutboxEntry, OutboxRow, Params, outbox_params, outbox_row
from ._model import (
    NO_FENCE,
    ClaimResult,
    CompletionRequest,
    CompletionResult,
    Head,
    answer_to,
    check_call,
    completion_params,
    decide_claim,
    highest,
)
from ._postgres import PostgresStore, _Attempt, _completion, _Conn, _maybe_completion

_LOCK_HEAD = """
    INSERT INTO leaseworker_jobs AS j (job_key, fence, input_version, updated_at)
    VALUES (%s, -1, '', now())
    ON CONFLICT (job_key) DO UPDATE SET job_key = j.job_key
    RETURNING j.fence, j.input_version, j.claimed_fence
"""
_FIND = """
    SELECT input_version, fence, result, execution_id, pod, completed_at
    FROM leaseworker_completions WHERE job_key = %s AND input_version = %s
"""
_COMPLETE = """
    SELECT * FROM leaseworker_complete(
        %(job_key)s, %(input_version)s, %(fence)s, %(result)s::jsonb, %(execution_id)s, %(pod)s)
"""
_INSERT = """
    INSERT INTO leaseworker_outbox
        (job_key, input_version, seq, fence, topic, msg_key, value, headers, trace)
    VALUES (%(job_key)s, %(input_version)s, %(seq)s, %(fence)s, %(topic)s, %(msg_key)s,
            %(value)s, %(headers)s, %(trace)s)
"""
_COLUMNS = (
    "o.id, o.job_key, o.input_version, o.seq, o.fence, o.topic, o.msg_key, o.value,"
    " o.headers, o.trace"
)
# Candidates: the oldest unsent rows nobody else holds, locked (others skip them).
# A candidate is claimed only if no earlier unsent row of its job key is left
# out (held by another relay, locked, or past the limit): that keeps each
# key's order across relays. An earlier row of a key committed before a later
# one (the head row lock), so a snapshot that sees the later one sees it. The
# check is a scalar subquery, so it runs per candidate on the (job_key, id)
# index whatever the table's statistics say (a fresh table's once made the
# planner compare every candidate with every unsent row).
_CLAIM = f"""
    WITH candidates AS (
        SELECT id, job_key FROM leaseworker_outbox
        WHERE sent_at IS NULL
          AND (claimed_by IS NULL OR claimed_by = %(relay)s OR claimed_until < now())
        ORDER BY id LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ), ready AS (
        SELECT c.id FROM candidates c
        WHERE (
            SELECT e.id FROM leaseworker_outbox e
            WHERE e.job_key = c.job_key AND e.sent_at IS NULL AND e.id < c.id
              AND e.id <> ALL (ARRAY(SELECT id FROM candidates))
            LIMIT 1
        ) IS NULL
    )
    UPDATE leaseworker_outbox o
    SET claimed_by = %(relay)s, claimed_until = now() + make_interval(secs => %(hold)s),
        attempts = o.attempts + 1
    FROM ready WHERE o.id = ready.id
    RETURNING {_COLUMNS}
"""
MARK = """
    UPDATE leaseworker_outbox SET sent_at = now()
    WHERE id = ANY(%s::bigint[]) AND claimed_by = %s AND sent_at IS NULL
"""
RELEASE = """
    UPDATE leaseworker_outbox SET claimed_by = NULL, claimed_until = NULL
    WHERE id = ANY(%s::bigint[]) AND claimed_by = %s AND sent_at IS NULL
"""
_ENTRIES = f"SELECT {_COLUMNS}, o.committed_at, o.sent_at, o.attempts FROM leaseworker_outbox o"
_BACKLOG = """
    SELECT count(*), extract(epoch FROM now() - min(committed_at))::float8
    FROM leaseworker_outbox WHERE sent_at IS NULL
"""
# The ``limit`` oldest sent rows (the primary key's order), of which those sent
# before the cutoff: a bounded scan, and ``sent_at < ...`` is never true of an unsent row.
PRUNE = """
    DELETE FROM leaseworker_outbox
    WHERE id IN (SELECT id FROM leaseworker_outbox WHERE sent_at IS NOT NULL
                 ORDER BY id LIMIT %(limit)s)
      AND sent_at < now() - make_interval(secs => %(older_than)s)
"""


@contextlib.asynccontextmanager
async def transaction(
    store: PostgresStore, job_key: str, input_version: str, fence: int
) -> AsyncIterator[PgTransaction]:
    """Begin on a connection of its own and lock the head row; see ``EffectStore.transaction``."""
    check_call(job_key, fence, input_version)
    async with contextlib.AsyncExitStack() as stack:
        try:
            with anyio.fail_after(store._timeout):
                conn = await stack.enter_async_context(
                    store._pool.connection(timeout=store._timeout)
                )
                await conn.execute("BEGIN")
                stack.push_async_callback(_rollback, conn)
                opened = await _open(conn, job_key, input_version, fence)
        except (psycopg.Error, TimeoutError) as exc:
            raise StoreUnavailable(job_key, _describe(store, exc)) from exc
        yield PgTransaction(store, conn, opened)


async def _open(conn: _Conn, job_key: str, input_version: str, fence: int) -> ClaimResult:
    row = await (await conn.execute(_LOCK_HEAD, (job_key,))).fetchone()
    assert row is not None  # INSERT ... ON CONFLICT DO UPDATE ... RETURNING: always one row
    head_fence, head_version, claimed = row
    head = None if head_fence == NO_FENCE else Head(head_fence, head_version)
    found = await (await conn.execute(_FIND, (job_key, input_version))).fetchone()
    standing = None if found is None else _completion(job_key, found)
    return ClaimResult(
        status=decide_claim(standing, head, fence, claimed=claimed),
        job_key=job_key,
        input_version=input_version,
        fence=fence,
        highest_fence=highest(head, claimed),
        completion=standing,
    )


async def _rollback(conn: _Conn) -> None:
    """Roll back whatever was not committed (shielded; a broken connection is the pool's)."""
    with anyio.CancelScope(shield=True), contextlib.suppress(psycopg.Error):
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            await conn.execute("ROLLBACK")


@final
class PgTransaction:
    """A job's transaction on PostgreSQL; see ``StoreTransaction``."""

    def __init__(self, store: PostgresStore, conn: _Conn, opened: ClaimResult) -> None:
        self._store = store
        self._conn = conn
        self.opened = opened
        self.statements: list[tuple[str, Params]] = []
        self._done = False

    @property
    def connection(self) -> _Conn:
        """The psycopg connection, inside the transaction (its own blocks become savepoints)."""
        return self._conn

    async def execute(self, sql: str, params: Params = None) -> list[tuple[Any, ...]]:
        """Run one of the job's statements; return its rows (lost connection: StoreUnavailable)."""
        self._check()
        self.statements.append((sql, params))
        try:
            cursor = await self._conn.execute(sql, params)
            return list(await cursor.fetchall()) if cursor.description else []
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(self.opened.job_key, _describe(self._store, exc)) from exc

    async def commit(
        self, request: CompletionRequest, messages: Sequence[Message]
    ) -> CompletionResult:
        """Record the completion and the messages, then commit (or roll back if refused)."""
        self._check()
        self._done = True
        params = completion_params(request)
        rows = outbox_params(request, messages)
        try:
            with anyio.fail_after(self._store._timeout):
                found = await (await self._conn.execute(_COMPLETE, params)).fetchone()
                assert found is not None  # leaseworker_complete() returns one row on every path
                status, seen, *standing = found
                answer = answer_to(
                    request,
                    status,
                    winning_fence=seen,
                    completion=_maybe_completion(request.job_key, tuple(standing)),
                )
                if status != "accepted":
                    await self._conn.execute("ROLLBACK")
                    return answer
                if len(rows) == 1:  # the common case: executemany's pipeline costs a sync more
                    await self._conn.execute(_INSERT, rows[0])
                elif rows:
                    async with self._conn.cursor() as cursor:
                        await cursor.executemany(_INSERT, rows)
                await self._conn.execute("COMMIT")
        except (psycopg.Error, TimeoutError) as exc:
            raise StoreUnavailable(request.job_key, _describe(self._store, exc)) from exc
        return answer

    def _check(self) -> None:
        if self._done or self.opened.status != "claimed":
            raise StoreUnavailable(self.opened.job_key, "the transaction is not open")


async def claim_outbox(
    store: PostgresStore, relay: str, limit: int, hold: float
) -> list[OutboxRow]:
    """Claim as ``EffectStore.claim_outbox`` says (one autocommit statement)."""
    params = {"relay": relay, "limit": limit, "hold": hold}

    async def run(conn: _Conn, attempt: _Attempt) -> list[TupleRow]:
        return await (await conn.execute(_CLAIM, params)).fetchall()

    found = await store._run(None, run)
    return sorted((outbox_row(row) for row in found), key=lambda row: row.id)


async def update(store: PostgresStore, sql: str, relay: str, ids: Sequence[int]) -> int:
    """Run ``MARK`` or ``RELEASE`` for ``relay``'s rows ``ids``; return the row count.

    The ids go as one array literal: psycopg's list adaptation checks every
    element (about 2 us per row of a 500-row mark).
    """
    literal = "{" + ",".join(map(str, map(int, ids))) + "}"

    async def run(conn: _Conn, attempt: _Attempt) -> int:
        return (await conn.execute(sql, (literal, relay))).rowcount

    return await store._run(None, run) if ids else 0


async def prune(store: PostgresStore, older_than: float, limit: int) -> int:
    """Delete old sent rows as ``EffectStore.prune_outbox`` says (one autocommit statement)."""
    params = {"older_than": older_than, "limit": limit}

    async def run(conn: _Conn, attempt: _Attempt) -> int:
        return (await conn.execute(PRUNE, params)).rowcount

    return await store._run(None, run)


async def entries(store: PostgresStore, job_key: str | None) -> list[OutboxEntry]:
    """Every outbox row (of ``job_key``) with its state."""
    where, args = (" WHERE o.job_key = %s", (job_key,)) if job_key is not None else ("", ())

    async def run(conn: _Conn, attempt: _Attempt) -> list[TupleRow]:
        return await (await conn.execute(_ENTRIES + where + " ORDER BY o.id", args)).fetchall()

    return [
        OutboxEntry(
            row=outbox_row(row[:-3]), committed_at=row[-3], sent_at=row[-2], attempts=row[-1]
        )
        for row in await store._run(job_key, run)
    ]


async def backlog(store: PostgresStore) -> tuple[int, float | None]:
    """Return the unsent rows' count and the oldest one's age in seconds."""

    async def run(conn: _Conn, attempt: _Attempt) -> tuple[int, float | None]:
        row = await (await conn.execute(_BACKLOG)).fetchone()
        assert row is not None  # an aggregate: always one row
        return int(row[0]), None if row[1] is None else max(0.0, float(row[1]))

    return await store._run(None, run)


def _describe(store: PostgresStore, exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {store._timeout}s"
    if isinstance(exc, PoolTimeout | PoolClosed | psycopg.Error):
        return store._describe(exc, _Attempt())
    return type(exc).__name__
