"""PostgreSQL's transactions for jobs and its outbox's reads.

A job's transaction takes a pooled connection of its own, begins, locks the
job key's head row (the lock every claim and completion of the key takes)
and reads the identity after the lock, as ``leaseworker_complete()`` does;
its commit calls that same function, then inserts the messages, in the same
transaction. It locks one head row and waits for no batch, so it cannot
close a cycle with the batches' key-ordered locks (docs/design.md).
What is unsent is a row of ``leaseworker_outbox_unsent`` (the queue, which
the committing statement fills with the outbox rows); the relays' claims of
it are :mod:`._pg_claims`. Here too: the outbox's state, backlog and prune.
See docs/effects.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any, final

import anyio
import psycopg
from psycopg.rows import TupleRow

from ..._errors import StoreUnavailable
from .._effect_rows import Message, OutboxEntry, Params, outbox_params, outbox_row
from .._fencing import (
    NO_FENCE,
    ClaimResult,
    CompletionRequest,
    CompletionResult,
    Head,
    answer_to,
    check_call,
    claim_answer,
    completion_params,
)
from ._pg_pool import Attempt, Conn, PgPool, completion_of, maybe_completion_of, rollback

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
# The row and its place in the queue of unsent ids, in one statement.
_INSERT = """
    WITH added AS (
        INSERT INTO leaseworker_outbox
            (job_key, input_version, seq, fence, topic, msg_key, value, headers, trace,
             effect_id, queued)
        VALUES (%(job_key)s, %(input_version)s, %(seq)s, %(fence)s, %(topic)s, %(msg_key)s,
                %(value)s, %(headers)s, %(trace)s, %(effect_id)s, true)
        RETURNING id, job_key
    )
    INSERT INTO leaseworker_outbox_unsent (id, job_key) SELECT id, job_key FROM added
"""
COLUMNS = (
    "o.id, o.job_key, o.input_version, o.seq, o.fence, o.topic, o.msg_key, o.value,"
    " o.headers, o.trace, o.effect_id"
)
_ENTRIES = (
    f"SELECT {COLUMNS}, o.committed_at, o.sent_at, o.attempts, o.sent_by"
    " FROM leaseworker_outbox_state o"
)
_BACKLOG = """
    SELECT count(*), extract(epoch FROM now() - min(o.committed_at))::float8
    FROM leaseworker_outbox_unsent u JOIN leaseworker_outbox o ON o.id = u.id
    WHERE left(o.job_key, %s::int) = %s
"""
# The oldest rounds (the primary key's order) whose rows add up to ``limit`` at
# most, of which those sent before the cutoff, with their rows: a bounded
# scan of whole rounds; the oldest goes even if bigger (else it would stay).
PRUNE = """
    WITH rounds AS (
        DELETE FROM leaseworker_outbox_sent
        WHERE id IN (
            SELECT id FROM (
                SELECT id, cardinality(ids) AS n, sum(cardinality(ids)) OVER (ORDER BY id) AS upto
                FROM leaseworker_outbox_sent ORDER BY id LIMIT %(limit)s
            ) oldest WHERE upto <= %(limit)s OR upto = n)
          AND sent_at < now() - make_interval(secs => %(older_than)s)
        RETURNING ids
    )
    DELETE FROM leaseworker_outbox WHERE id IN (SELECT unnest(ids) FROM rounds)
"""


@contextlib.asynccontextmanager
async def transaction(
    pool: PgPool, job_key: str, input_version: str, fence: int
) -> AsyncIterator[PgTransaction]:
    """Begin on a connection of its own and lock the head row; see ``EffectStore.transaction``."""
    check_call(job_key, fence, input_version)
    async with contextlib.AsyncExitStack() as stack:
        try:
            with anyio.fail_after(pool.timeout):
                conn = await stack.enter_async_context(pool.pool.connection(timeout=pool.timeout))
                await conn.execute("BEGIN")
                stack.push_async_callback(rollback, conn)
                opened = await _open(conn, job_key, input_version, fence)
        except (psycopg.Error, TimeoutError) as exc:
            raise StoreUnavailable(job_key, pool.detail(exc)) from exc
        yield PgTransaction(pool, conn, opened)


async def _open(conn: Conn, job_key: str, input_version: str, fence: int) -> ClaimResult:
    row = await (await conn.execute(_LOCK_HEAD, (job_key,))).fetchone()
    assert row is not None  # INSERT ... ON CONFLICT DO UPDATE ... RETURNING: always one row
    head_fence, head_version, claimed = row
    head = None if head_fence == NO_FENCE else Head(head_fence, head_version)
    found = await (await conn.execute(_FIND, (job_key, input_version))).fetchone()
    standing = None if found is None else completion_of(job_key, found)
    return claim_answer(
        job_key, input_version, fence, standing=standing, head=head, claimed=claimed
    )


@final
class PgTransaction:
    """A job's transaction on PostgreSQL; see ``StoreTransaction``."""

    def __init__(self, pool: PgPool, conn: Conn, opened: ClaimResult) -> None:
        self._pool = pool
        self._conn = conn
        self.opened = opened
        self.statements: list[tuple[str, Params]] = []
        self._done = False

    @property
    def connection(self) -> Conn:
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
            raise StoreUnavailable(self.opened.job_key, self._pool.detail(exc)) from exc

    async def commit(
        self, request: CompletionRequest, messages: Sequence[Message]
    ) -> CompletionResult:
        """Record the completion and the messages, then commit (or roll back if refused)."""
        self._check()
        self._done = True
        params = completion_params(request)
        rows = outbox_params(request, messages)
        try:
            with anyio.fail_after(self._pool.timeout):
                found = await (await self._conn.execute(_COMPLETE, params)).fetchone()
                assert found is not None  # leaseworker_complete() returns one row on every path
                status, seen, *standing = found
                answer = answer_to(
                    request,
                    status,
                    winning_fence=seen,
                    completion=maybe_completion_of(request.job_key, tuple(standing)),
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
            raise StoreUnavailable(request.job_key, self._pool.detail(exc)) from exc
        return answer

    def _check(self) -> None:
        if self._done or self.opened.status != "claimed":
            raise StoreUnavailable(self.opened.job_key, "the transaction is not open")


async def prune(pool: PgPool, older_than: float, limit: int) -> int:
    """Delete old sent rows as ``EffectStore.prune_outbox`` says (one autocommit statement)."""
    params = {"older_than": older_than, "limit": limit}

    async def run(conn: Conn, attempt: Attempt) -> int:
        return (await conn.execute(PRUNE, params)).rowcount

    return await pool.run(None, run)


async def entries(pool: PgPool, job_key: str | None) -> list[OutboxEntry]:
    """Every outbox row (of ``job_key``) with its state."""
    where, args = (" WHERE o.job_key = %s", (job_key,)) if job_key is not None else ("", ())

    async def run(conn: Conn, attempt: Attempt) -> list[TupleRow]:
        return await (await conn.execute(_ENTRIES + where + " ORDER BY o.id", args)).fetchall()

    return [
        OutboxEntry(
            row=outbox_row(row[:-4]),
            committed_at=row[-4],
            sent_at=row[-3],
            attempts=row[-2],
            sent_by=row[-1],
        )
        for row in await pool.run(job_key, run)
    ]


async def backlog(pool: PgPool, prefix: str = "") -> tuple[int, float | None]:
    """Return the unsent rows' count (of job keys starting with ``prefix``), the oldest's age."""

    async def run(conn: Conn, attempt: Attempt) -> tuple[int, float | None]:
        row = await (await conn.execute(_BACKLOG, (len(prefix), prefix))).fetchone()
        assert row is not None  # an aggregate: always one row
        return int(row[0]), None if row[1] is None else max(0.0, float(row[1]))

    return await pool.run(None, run)
