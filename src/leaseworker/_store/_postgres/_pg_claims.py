"""The relays' claims of PostgreSQL's outbox queue: locked rows, marked sent or given back.

A relay's claim is row locks on queue rows (``leaseworker_outbox_unsent``,
``FOR UPDATE SKIP LOCKED``) in a transaction of its own, kept open across
the send and ended by the mark or the release, both of which commit. The
mark deletes its queue rows (a delete stamps a tuple: no new version, no
index entry) and records the round, one ``leaseworker_outbox_sent`` row of
ids; the outbox row is never written again. The transaction's
``idle_in_transaction_session_timeout`` is the claim's ``hold``: a paused
relay's session is ended and its locks freed for another relay, and its
late mark fails (its transaction is gone) instead of marking what another
relay sent; a dead relay's session ends with its connection.
See docs/effects.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import final

import anyio
import psycopg
from psycopg import AsyncCursor, sql
from psycopg.rows import TupleRow
from psycopg_pool import PoolClosed, PoolTimeout

from ..._errors import StoreUnavailable
from .._effect_rows import OutboxRow, outbox_row
from ._pg_effects import COLUMNS
from ._pg_pool import Attempt, Conn, PgPool, rollback

logger = logging.getLogger("leaseworker.relay")

_LOST = (psycopg.OperationalError, psycopg.errors.IdleInTransactionSessionTimeout)
"""A claim's session ended: its hold ran out (25P03), it was terminated, the store went away."""

# Candidates: the oldest queued (unsent) rows nobody else holds, locked (others
# skip them; the locks are the claim, held until the round's mark or release
# ends its transaction). A candidate is claimed only if no earlier queued row
# of its job key is left out: such a row lies below the last candidate (the
# candidates are the lowest ids not locked, from the floor up: see
# ``claim_query``), so the rows left out are the queue's prefix up to it minus
# the candidates (``skipped``: held by another relay or locked, or below the
# floor), from the queue's start, one range scan and a hash anti-join, not an
# index probe per candidate (2.8 ms instead of 4.2 for 1,000 rows). That keeps
# each key's order across relays. An earlier row of a key committed before a
# later one (the head row lock), so a snapshot that sees the later one sees it.
# The rows are fetched by id from the array of ready ids, an index scan on the
# primary key: a join with ``ready`` let the planner, which guesses a few ready
# rows, scan the whole outbox once per ready row (1,000 rows of 1,500: 22 ms
# instead of 4). The rows this process's other claims hold are filtered out
# before any lock is tried (``where``, with the floor: see ``claim_query``).
_CLAIM = f"""
    WITH candidates AS (
        SELECT id, job_key FROM leaseworker_outbox_unsent {{where}}
        ORDER BY id LIMIT {{limit}}
        FOR UPDATE SKIP LOCKED
    ), skipped AS (
        SELECT u.id, u.job_key FROM leaseworker_outbox_unsent u
        WHERE u.id < (SELECT max(id) FROM candidates)
          AND NOT EXISTS (SELECT FROM candidates c WHERE c.id = u.id)
    ), ready AS (
        SELECT c.id FROM candidates c
        WHERE NOT EXISTS (SELECT FROM skipped s WHERE s.job_key = c.job_key AND s.id < c.id)
    )
    SELECT {COLUMNS} FROM leaseworker_outbox o WHERE o.id = ANY (ARRAY(SELECT id FROM ready))
"""
_BEGIN = (
    "BEGIN; SET LOCAL idle_in_transaction_session_timeout = {hold};"
    " SET LOCAL application_name = 'leaseworker-relay-claim';"
)
# Under the claim's locks: the queue rows are there (the lock rechecked them).
# One round row for the ids marked, none if none was; its time is the
# statement's, not the transaction's (now() is the claim's, before the send).
_MARK = """
    WITH gone AS (
        DELETE FROM leaseworker_outbox_unsent WHERE id = ANY({ids}::bigint[])
        RETURNING id, attempts
    )
    INSERT INTO leaseworker_outbox_sent (relay, sent_at, ids, attempts)
    SELECT {relay}, statement_timestamp(), array_agg(id ORDER BY id),
           array_agg(attempts + 1 ORDER BY id)
    FROM gone HAVING count(*) > 0
    RETURNING cardinality(ids);
"""
_ATTEMPTED = (
    "UPDATE leaseworker_outbox_unsent SET attempts = attempts + 1 WHERE id = ANY({ids}::bigint[]);"
)
# The mark and the release touch the claim's rows only, by primary key. The
# planner, costing each index probe as a read from disk, scanned the whole
# queue instead from a few thousand queued rows on: a mark's cost grew with
# the backlog (16.6 ms for 1,000 rows at 200,000 queued, 1.5-2.6 ms by key at
# any size). Those rows were locked by this transaction: they are in memory.
_BY_KEY = "SET LOCAL enable_seqscan = off;"
MARK = "mark"
RELEASE = "release"


@dataclass(slots=True)
class _Held:
    """A relay's open claim: its transaction's connection, the ids it locked, until when.

    ``until`` (``_now``) is when its ``hold`` runs out: the server
    may end its session from then on, freeing its locks for any claim.
    """

    conn: Conn
    ids: list[int]
    until: float


FLOOR_FOR = 1.0
"""Seconds claims scan from past the last full claim before one scans the whole queue again."""

_now = time.monotonic
"""The claims' clock: their ``until`` and ``floor_until`` (a test turns it by hand)."""


def relay_share(max_connections: int) -> int:
    """Return the pooled connections a store's relay may hold at once by default: two fifths.

    Four of a pod's ten, for its rounds' claims (a connection each, from
    the claim to the mark) and its prunes, where it could hold six and a
    prune before: its three rounds in flight send while the next one claims
    (the most it held unbounded in bench/relay_share.py), their marks and a
    prune wait their turn; the jobs' transactions keep six while a backlog
    drains. A share of the one pool, not a pool of the relay's own: with no
    backlog the jobs may use all ten, and the server sees no more connections.
    """
    return max(1, max_connections * 2 // 5)


@final
class OutboxClaims:
    """The claims of this process on one store: the open ones by name, and where to scan from.

    ``floor`` is where the next claim's scan of the queue starts: past the
    rows of the last full claim (0: the queue's start), until ``floor_until``
    (``_now``). See :meth:`query`. ``share``: how many pooled connections
    the claims (and :meth:`slot` s) hold at once, at most; a claim beyond it
    waits for one to be given back, which the rounds holding them do within
    their ``hold``.
    """

    def __init__(self, pool: PgPool, share: int) -> None:
        self._pool = pool
        self.share = share
        self._slots = anyio.Semaphore(share)
        self.held: dict[str, _Held] = {}
        self.floor = 0
        self.floor_until = 0.0

    @property
    def waiting(self) -> int:
        """How many claims (or :meth:`slot` s) wait for a connection of the share."""
        return self._slots.statistics().tasks_waiting

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one connection of the share for the block (the relay's prune)."""
        async with self._slots:
            yield

    async def claim(self, relay: str, limit: int, hold: float) -> list[OutboxRow]:
        """Claim as ``EffectStore.claim_outbox`` says: lock the rows, keep the transaction open.

        One simple-protocol query (begin, the session timeout, the claim): one
        round trip. No rows: the transaction ends at once.
        """
        held = self.held
        open_claim = held.pop(relay, None)
        if (
            open_claim is not None
        ):  # its rows lie below the floor: it keeps them only from the start
            self.floor = 0
        query = self.query(limit)
        if open_claim is None:
            hold_ms = sql.Literal(f"{max(1, math.ceil(hold * 1000))}ms")
            query = sql.SQL(_BEGIN).format(hold=hold_ms) + query
        # A relay claiming again under the same name (its claim still open) does so in
        # the same transaction: its own locks do not skip, so it keeps what it held.
        conn = await self._connection() if open_claim is None else open_claim.conn
        try:
            with anyio.fail_after(self._pool.timeout):
                until = _now() + hold  # the server's idle timeout starts after this
                cursor = _to_rows(await conn.execute(query))  # BEGIN, SET, SET, then the rows
                found = await cursor.fetchall()
        except BaseException as exc:
            await self._end(conn)
            if isinstance(exc, psycopg.Error | TimeoutError):
                raise StoreUnavailable(None, self._pool.detail(exc)) from exc
            raise
        rows = sorted((outbox_row(row) for row in found), key=lambda row: row.id)
        self._raise_floor(rows, limit, _now())
        if not rows:
            await self._end(conn)
            return []
        held[relay] = _Held(conn, [row.id for row in rows], until)
        return rows

    async def update(self, what: str, relay: str, ids: Sequence[int]) -> int:
        """End ``relay``'s claim: mark ``ids`` sent (``MARK``) or give them up (``RELEASE``).

        Both commit the claim's transaction, counting an attempt on every row
        it locked; the mark returns how many rows it marked. A claim already
        ended (a mark then a release of the rest) or never open: nothing to do.
        A claim whose session is gone (the server ended it after ``hold``, or
        the store went away) marks nothing and returns 0: its locks are free, and
        another relay may have sent and marked those rows since.
        """
        claim = self.held.pop(relay, None)
        if claim is None:
            return 0
        sent = set(ids).intersection(claim.ids) if what == MARK else set()  # its own only
        unsent = [row_id for row_id in claim.ids if row_id not in sent]
        if unsent:  # rows given back, below the floor: the next claim scans from the start
            self.floor = 0
        parts = [*settle_statements(relay, sorted(sent), unsent), sql.SQL("COMMIT")]
        # It commits: bounded by a socket shutdown and shielded, never a cancel
        # request (psycopg's on a cancelled await), which would end a wait for a
        # synchronous standby and commit the mark unreplicated (see _pg_effects).
        attempt = Attempt()
        timer = asyncio.get_running_loop().call_later(self._pool.timeout, attempt.sever, claim.conn)
        try:
            with anyio.CancelScope(shield=True):
                cursor = _to_rows(await claim.conn.execute(sql.SQL(" ").join(parts)))  # SET, mark
                marked = await cursor.fetchone() if sent else None  # RETURNING: a round, or none
            return int(marked[0]) if marked else 0
        except _LOST as exc:  # the session is gone, its transaction with it
            if attempt.expired:  # or it waits on: its mark may land still
                raise StoreUnavailable(None, self._pool.detail(TimeoutError())) from exc
            self.floor = 0
            logger.warning(
                "outbox relay: claim %s lapsed before its mark (%s); nothing marked",
                relay,
                self._pool.detail(exc),
                extra={"event": "relay_claim_lapsed"},
            )
            return 0
        except psycopg.Error as exc:
            raise StoreUnavailable(None, self._pool.detail(exc)) from exc
        finally:
            timer.cancel()
            await self._end(claim.conn)

    def query(self, limit: int) -> sql.Composed:
        """Return the claim's statement: it scans from the floor and passes this process's rows.

        The floor: after a full claim, the next one's candidates are looked for
        past its rows. Below them lie the rounds marked since the oldest claim
        still open began: their deleted queue rows stay in the index until no
        transaction could see them, and every claim from the start walked them,
        one heap visit each (its candidates' scan: 4,600 to 9,300 buffer hits a
        claim in the relay bench, 1,000 with the floor). Rows only the start
        finds (given back, committed late, of a relay that died) wait for the
        next claim that starts there: after a claim of less than its limit, a
        release, a lapsed claim, and every ``FLOOR_FOR`` seconds. A key's order does not
        rest on the floor: the rows left out are looked for from the queue's start.

        The rows this process's open claims hold are locked, so ``SKIP LOCKED``
        would pass them anyway, but only after trying each one's lock: a claim
        behind two rounds of 1,000 tried 2,000 locks, 3.5 of its 10 ms in
        PostgreSQL (bench/README.md, relay). Filtered by a hashed ``<> ALL``
        first, they are passed before any lock is tried. Another relay's locks
        are still tried (this process does not know them), and so are a claim's
        whose ``hold`` ran out: its session may be gone and its rows free.
        """
        now = _now()
        if self.floor and now >= self.floor_until:
            self.floor = 0
        ids = [
            row_id
            for claim in self.held.values()
            if now < claim.until
            for row_id in claim.ids
            if row_id >= self.floor
        ]
        where: list[sql.Composable] = []
        if self.floor:
            where.append(sql.SQL("id >= {floor}").format(floor=sql.Literal(self.floor)))
        if ids:
            where.append(sql.SQL("id <> ALL ({ids}::bigint[])").format(ids=_ids(ids)))
        clause = sql.SQL("WHERE ") + sql.SQL(" AND ").join(where) if where else sql.SQL("")
        return sql.SQL(_CLAIM).format(limit=sql.Literal(int(limit)), where=clause)

    def _raise_floor(self, rows: Sequence[OutboxRow], limit: int, now: float) -> None:
        """After a claim: past its rows if it was full, else back to the queue's start."""
        if not rows or len(rows) < limit:
            self.floor = 0
            return
        if self.floor == 0:
            self.floor_until = now + FLOOR_FOR
        self.floor = max(self.floor, rows[-1].id + 1)

    async def _connection(self) -> Conn:
        """Take a connection of the share (waiting for one), then of the pool; see :meth:`_end`."""
        await self._slots.acquire()
        try:
            return await self._pool.pool.getconn(timeout=self._pool.timeout)
        except BaseException as exc:
            self._slots.release()
            if isinstance(exc, PoolTimeout | PoolClosed):
                raise StoreUnavailable(None, self._pool.detail(exc)) from exc
            raise

    async def _end(self, conn: Conn) -> None:
        """Roll back what is still open, give ``conn`` back to the pool and its share (shielded)."""
        try:
            with anyio.CancelScope(shield=True):
                await rollback(conn)
                await self._pool.pool.putconn(conn)
        finally:
            self._slots.release()


def settle_statements(
    relay: str, sent: Sequence[int], unsent: Sequence[int]
) -> list[sql.SQL | sql.Composed]:
    """Return what ends ``relay``'s claim before it commits: plans by key, mark, attempts.

    ``sent`` (ascending) are deleted from the queue and recorded as one round;
    ``unsent`` stay queued with an attempt counted.
    """
    statements: list[sql.SQL | sql.Composed] = [sql.SQL(_BY_KEY)]
    if sent:
        statements.append(sql.SQL(_MARK).format(relay=sql.Literal(relay), ids=_ids(sent)))
    if unsent:
        statements.append(sql.SQL(_ATTEMPTED).format(ids=_ids(unsent)))
    return statements


def _to_rows(cursor: AsyncCursor[TupleRow]) -> AsyncCursor[TupleRow]:
    """Move ``cursor`` of several statements to the first result with rows (if any); return it."""
    while cursor.description is None and cursor.nextset():
        pass
    return cursor


def _ids(ids: Sequence[int]) -> sql.Literal:
    """Return the ids as one array literal (psycopg's list adaptation checks every element)."""
    return sql.Literal("{" + ",".join(map(str, map(int, ids))) + "}")
