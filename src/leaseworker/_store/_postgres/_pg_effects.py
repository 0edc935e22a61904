"""PostgreSQL's transactions for jobs and its outbox's reads.

A job's transaction takes a pooled connection of its own, begins, locks the
job key's head row (the lock every claim and completion of the key takes)
and reads the identity after the lock, as ``leaseworker_complete()`` does;
its commit calls that same function, then inserts the messages, in the same
transaction. It locks one head row and waits for no batch, so it cannot
close a cycle with the batches' key-ordered locks (docs/design.md).
Its budget is the lease, renewals included, not the store's timeout: a
statement has no bound of its own on the server; the pod ends it (a
cancel request) when the execution's scope fires (:meth:`PgTransaction.execute`).
The time between statements is bounded by the lease's remaining validity
(:class:`Limits`), so the server ends a session paused there; a session
paused inside a statement is ended by the execution that takes the key
over (the transaction carries its key and fence: :mod:`._pg_takeover`).
What is unsent is a row of ``leaseworker_outbox_unsent`` (the queue, which
the committing statement fills with the outbox rows); the relays' claims of
it are :mod:`._pg_claims`. Here too: the outbox's state, backlog and prune.
See docs/effects.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
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
from ._pg_takeover import ending_older_holders, marker

# The lock, and the session's mark once it holds it (RETURNING runs under it).
_LOCK_HEAD = """
    INSERT INTO leaseworker_jobs AS j (job_key, fence, input_version, updated_at)
    VALUES (%s, -1, '', now())
    ON CONFLICT (job_key) DO UPDATE SET job_key = j.job_key
    RETURNING j.fence, j.input_version, j.claimed_fence,
              set_config('application_name', %s, true)
"""
_COMPLETE = """
    SELECT * FROM leaseworker_complete(
        %(job_key)s, %(input_version)s, %(fence)s, %(result)s::jsonb, %(execution_id)s, %(pod)s,
        %(cpu_seconds)s::double precision, %(peak_memory)s::bigint)
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


# Set before each statement of the job's (and again after one that took a
# while): the idle bound after it, from the lease's validity left, and the
# statement's own (none: '0'; the commit's: the store's timeout at most). Not
# pipelined with the statement: after psycopg's pipeline the server sat idle
# with no idle bound armed (PostgreSQL 15, psycopg 3.3). A failed statement
# aborts its transaction, which frees its locks at once. PostgreSQL 17's
# transaction_timeout is not set: it would end a statement the lease's
# renewals keep legitimate, and the two bounds here cover what it would.
_SET = (
    "set_config('statement_timeout', %(statement)s, true),"
    " set_config('idle_in_transaction_session_timeout', %(idle)s, true)"
)
# The identity's completion, read with the first bounds set: one row always
# (the settings' columns are read, so the planner keeps them).
_FIND_SETTING = """
    SELECT c.input_version, c.fence, c.result, c.execution_id, c.pod, c.completed_at, l.*
    FROM (SELECT {}) AS l
    LEFT JOIN leaseworker_completions c
      ON c.job_key = %(job_key)s AND c.input_version = %(input_version)s
"""
RESET_AFTER = 0.01
"""Seconds after which the bounds are set again (before a statement, or after a long one).

Within it a statement or the commit goes under the bounds set last: at most
this much later than the lease's deadline, one round trip less.
"""

# Ended sessions and timeouts: the store failed, not the job (whose own errors,
# a constraint or a syntax error, stay its own). Class 25P: idle or transaction
# timeout; 57: operator intervention (query cancelled, admin shutdown, crash).
_STORE_STATES = ("25P03", "25P04", "57")


@contextlib.asynccontextmanager
async def transaction(
    pool: PgPool,
    job_key: str,
    input_version: str,
    fence: int,
    budget: Callable[[], float] | None = None,
) -> AsyncIterator[PgTransaction]:
    """Begin on a connection of its own and lock the head row; see ``EffectStore.transaction``."""
    check_call(job_key, fence, input_version)
    async with contextlib.AsyncExitStack() as stack:
        try:
            with anyio.fail_after(pool.timeout):
                conn = await stack.enter_async_context(pool.pool.connection(timeout=pool.timeout))
                limits = Limits(budget or (lambda: pool.timeout))
                await conn.execute("BEGIN")
                stack.push_async_callback(rollback, conn)
                with ending_older_holders(pool, conn, {job_key: fence}):
                    opened = await _open(conn, job_key, input_version, fence, limits)
        except (psycopg.Error, TimeoutError) as exc:
            raise StoreUnavailable(job_key, pool.detail(exc)) from exc
        yield PgTransaction(pool, conn, opened, limits)


@final
class Limits:
    """The server-side bounds of a job's transaction, from its budget (the lease's validity).

    The time between statements is bounded by
    ``idle_in_transaction_session_timeout``, the budget left when the last
    statement was sent; a statement of the job's is not bounded (the pod, or
    a takeover, ends it); the commit is, by the budget and the store's timeout.
    """

    def __init__(self, budget: Callable[[], float]) -> None:
        self._budget = budget
        self.sql = "SELECT " + _SET
        self.find = _FIND_SETTING.format(_SET)
        self.left = 0.0  # the budget when the limits were set last
        self._set_at = -math.inf  # when (time.monotonic())

    def params(self, *, cap: float | None = None) -> dict[str, str]:
        """Read the budget; return ``_SET``'s parameters (a statement bound: ``cap`` at most)."""
        self.left = left = max(0.001, self._budget())
        self._set_at = time.monotonic()
        return {"statement": "0" if cap is None else _ms(min(left, cap)), "idle": _ms(left)}

    async def set(self, conn: Conn, *, cap: float | None = None) -> None:
        """Set the bounds on ``conn`` from the budget left now, unless set within RESET_AFTER.

        A commit within it goes under the job's bounds, no round trip more: its
        statements are then bounded by the client (the store's timeout), and
        on 14+ by the server once the client went (``CHECK_CLIENT``).
        """
        if time.monotonic() - self._set_at >= RESET_AFTER:
            await conn.execute(self.sql, self.params(cap=cap))


def _ms(seconds: float) -> str:
    return f"{max(1, math.floor(seconds * 1000))}ms"


async def _open(
    conn: Conn, job_key: str, input_version: str, fence: int, limits: Limits
) -> ClaimResult:
    """Lock the head row; read the identity and bound the session by the lease from now on."""
    row = await (await conn.execute(_LOCK_HEAD, (job_key, marker(job_key, fence)))).fetchone()
    assert row is not None  # INSERT ... ON CONFLICT DO UPDATE ... RETURNING: always one row
    head_fence, head_version, claimed, _ = row
    head = None if head_fence == NO_FENCE else Head(head_fence, head_version)
    identity = {"job_key": job_key, "input_version": input_version, **limits.params()}
    found = await (await conn.execute(limits.find, identity)).fetchone()
    assert found is not None  # a LEFT JOIN from one row
    standing = None if found[0] is None else completion_of(job_key, found[:6])
    return claim_answer(
        job_key, input_version, fence, standing=standing, head=head, claimed=claimed
    )


@final
class PgTransaction:
    """A job's transaction on PostgreSQL; see ``StoreTransaction``."""

    def __init__(self, pool: PgPool, conn: Conn, opened: ClaimResult, limits: Limits) -> None:
        self._pool = pool
        self._conn = conn
        self._limits = limits
        self.opened = opened
        self.statements: list[tuple[str, Params]] = []
        self.hold_limit: float | None = None  # bounded by the lease, per statement (Limits)
        self._done = False

    @property
    def connection(self) -> Conn:
        """The psycopg connection, inside the transaction (its own blocks become savepoints)."""
        return self._conn

    async def execute(self, sql: str, params: Params = None) -> list[tuple[Any, ...]]:
        """Run one of the job's statements; return its rows. It lasts while the lease does.

        The idle bound first, then the statement, then (if it took a while)
        the bound again (see RESET_AFTER). The statement has no bound of its
        own: cancelled (the execution's scope fired), it is ended on the
        server before this raises (:func:`_statement`). A session the server
        ended raises StoreUnavailable; the job's own errors are psycopg's.
        """
        self._check()
        self.statements.append((sql, params))
        conn, limits = self._conn, self._limits
        try:
            await limits.set(conn)
            rows = await _statement(conn, sql, params, self._pool.timeout)
            await limits.set(conn)  # after a statement that took a while: the idle bound
        except psycopg.Error as exc:
            if not self._failed_store(exc):
                raise
            detail = f"{self._pool.detail(exc)} (lease validity at its start: {limits.left:.3f}s)"
            raise StoreUnavailable(self.opened.job_key, detail) from exc
        return rows

    def _failed_store(self, exc: psycopg.Error) -> bool:
        """Whether ``exc`` is the store's failure (connection, timeout), not the statement's."""
        state = exc.sqlstate or ""
        return (
            isinstance(exc, psycopg.OperationalError)
            or state.startswith(_STORE_STATES)
            or self._conn.broken
            or self._conn.closed
        )

    async def commit(
        self, request: CompletionRequest, messages: Sequence[Message]
    ) -> CompletionResult:
        """Record the completion and the messages, then commit (or roll back if refused).

        Bounded by the store's timeout and by the lease's validity, both;
        the ``COMMIT`` by the store's timeout only, on the client (:func:`_commit`).
        """
        self._check()
        self._done = True
        params = completion_params(request)
        rows = outbox_params(request, messages)
        conn, limits = self._conn, self._limits
        try:
            with anyio.fail_after(self._pool.timeout) as scope:
                await limits.set(conn, cap=self._pool.timeout)
                found = await (await conn.execute(_COMPLETE, params)).fetchone()
                assert found is not None  # leaseworker_complete() returns one row on every path
                status, seen, *standing = found
                answer = answer_to(
                    request,
                    status,
                    winning_fence=seen,
                    completion=maybe_completion_of(request.job_key, tuple(standing)),
                )
                if status != "accepted":
                    await conn.execute("ROLLBACK")
                    return answer
                if len(rows) == 1:  # the common case: executemany's pipeline costs a sync more
                    await conn.execute(_INSERT, rows[0])
                elif rows:
                    async with conn.cursor() as cursor:
                        await cursor.executemany(_INSERT, rows)
            await _commit(conn, scope.deadline)
        except (psycopg.Error, TimeoutError) as exc:
            raise StoreUnavailable(request.job_key, self._pool.detail(exc)) from exc
        return answer

    def _check(self) -> None:
        if self._done or self.opened.status != "claimed":
            raise StoreUnavailable(self.opened.job_key, "the transaction is not open")


async def _commit(conn: Conn, deadline: float) -> None:
    """Send ``COMMIT``; at ``deadline`` (the loop's clock) shut the socket down, raise TimeoutError.

    Never a cancel request: a cancel (or a terminate) that reaches a commit
    waiting for a synchronous standby ends the wait, not the transaction,
    which every session then sees though the standby may lack it. A cancelled
    await would have psycopg send one, so the deadline is a timer, not a
    cancel scope (the caller's is shielded). Nor does the server's
    ``statement_timeout`` reach it: PostgreSQL disarms it before it commits
    (checked on 15), nor ``client_connection_check_interval``. Left alone,
    the server commits once the standby has it; unanswered, it is ``lost``.
    """
    attempt = Attempt()
    timer = asyncio.get_running_loop().call_at(deadline, attempt.sever, conn)
    try:
        await conn.execute("COMMIT")
    except psycopg.OperationalError:
        if attempt.expired:
            raise TimeoutError from None
        raise
    finally:
        timer.cancel()


async def _statement(conn: Conn, sql: str, params: Params, bound: float) -> list[tuple[Any, ...]]:
    """Run ``sql`` on ``conn``; a cancelled caller ends it on the server before raising.

    psycopg's own answer to a cancelled task (send a cancel request, wait for
    the statement's end) is cancelled again by anyio's scope; psycopg then
    closes the connection and the server runs the statement on, its locks
    held. Here it runs in a task of its own, shielded; cancelled, the caller
    sends the cancel request and waits up to ``bound`` for the statement to
    end, else shuts the socket down (the server notices within
    ``client_connection_check_interval``, :class:`SessionSetup`), then
    raises. A bare asyncio task: an anyio task group cost some 80 µs more
    per statement.
    """
    ran = asyncio.get_running_loop().create_task(_rows(conn, sql, params))
    try:
        return await asyncio.shield(ran)
    except asyncio.CancelledError:
        with anyio.CancelScope(shield=True):
            await _stop(conn, ran, bound)
        raise


async def _rows(conn: Conn, sql: str, params: Params) -> list[tuple[Any, ...]]:
    cursor = await conn.execute(sql, params)
    return list(await cursor.fetchall()) if cursor.description else []


async def _stop(conn: Conn, ran: asyncio.Task[list[tuple[Any, ...]]], bound: float) -> None:
    """Cancel the statement ``ran`` runs; shut the socket down unless it ended within ``bound``."""
    with anyio.move_on_after(bound):
        if not ran.done():
            with contextlib.suppress(psycopg.Error):
                await conn.cancel_safe(timeout=bound)
        await asyncio.wait((ran,))
    if not ran.done():
        Attempt().sever(conn)  # the pending read fails at once
        await asyncio.wait((ran,))
    if not ran.cancelled():
        ran.exception()  # retrieved: its error (the cancel's) is not the caller's


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
