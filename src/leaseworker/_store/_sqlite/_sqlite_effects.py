"""SQLite's transactions for jobs and its outbox, on the store's one connection.

A job's transaction holds the connection alone (no batch runs meanwhile) and
the file's write lock (``BEGIN IMMEDIATE``) from its first step to its
commit, so the fence read at its start still stands when it commits. The
pod's other claims and completions wait behind it, so a block may last
:data:`HOLD_SHARE` of the store's timeout at most (``hold_limit``); the
executor refuses a longer one rather than stall the pod. Each
step runs on a worker thread (inline for ``:memory:``) under the store's
timeout; the commit is on disk before its answer, or (in a pod) before its
offset commit. The relay's claims are write calls of the ordinary batches,
answered once on disk.
See docs/effects.md.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any, final

import anyio

from ..._errors import StoreUnavailable
from .._effect_rows import (
    Message,
    OutboxEntry,
    OutboxRow,
    Params,
    outbox_params,
    outbox_row,
    pick_claims,
)
from .._fencing import (
    NO_FENCE,
    ClaimResult,
    CompletionRequest,
    CompletionResult,
    Head,
    check_call,
    claim_answer,
    completion_params,
)
from ._sqlite_connection import SqliteConnection
from ._sqlite_rules import _HEAD, _complete, _find

_INSERT = """
    INSERT INTO leaseworker_outbox
        (job_key, input_version, seq, fence, topic, msg_key, value, headers, trace, effect_id,
         committed_at)
    VALUES (:job_key, :input_version, :seq, :fence, :topic, :msg_key, :value, :headers, :trace,
            :effect_id, :now)
"""
_UNSENT = """
    SELECT id, job_key, claimed_by, coalesce(claimed_until, 0) FROM leaseworker_outbox
    WHERE sent_at IS NULL ORDER BY id LIMIT ?
"""
_COLUMNS = (
    "id, job_key, input_version, seq, fence, topic, msg_key, value, headers, trace, effect_id"
)
HOLD_SHARE = 0.5
"""The share of the store's timeout a job's transaction may hold the connection.

The calls queued behind it keep the other half to run in.
"""
SCAN = 8
"""Unsent rows looked at per row claimed: the rule reads a prefix in commit order."""


@contextlib.asynccontextmanager
async def transaction(
    db: SqliteConnection, job_key: str, input_version: str, fence: int, *, settled: bool
) -> AsyncIterator[SqliteTransaction]:
    """Hold the connection and the write lock; see ``EffectStore.transaction``.

    ``settled``: the commit's answer need not wait for the fsync (a pod's
    offset commit does; see ``SqliteConnection.run``).
    """
    check_call(job_key, fence, input_version)
    async with db.exclusive():
        try:
            opened = await db.step(job_key, lambda c: _begin(c, job_key, input_version, fence))
            yield SqliteTransaction(db, opened, settled=settled)
        finally:  # a failed rollback must not hide the block's own outcome
            with anyio.CancelScope(shield=True), contextlib.suppress(StoreUnavailable):
                await db.step(job_key, _rollback)


def _begin(conn: sqlite3.Connection, job_key: str, input_version: str, fence: int) -> ClaimResult:
    conn.execute("BEGIN IMMEDIATE")
    row = conn.execute(_HEAD, (job_key,)).fetchone()
    head_fence, head_version, claimed = (NO_FENCE, "", NO_FENCE) if row is None else row
    head = None if head_fence == NO_FENCE else Head(head_fence, head_version)
    standing = _find(conn, job_key, input_version)
    return claim_answer(
        job_key, input_version, fence, standing=standing, head=head, claimed=claimed
    )


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")


@final
class SqliteTransaction:
    """A job's transaction on the SQLite store; see ``StoreTransaction``."""

    def __init__(self, db: SqliteConnection, opened: ClaimResult, *, settled: bool) -> None:
        self._db = db
        self._settled = settled
        self.opened = opened
        self.statements: list[tuple[str, Params]] = []
        self.hold_limit: float | None = db.timeout * HOLD_SHARE  # seconds the block may hold it
        self._done = False

    @property
    def connection(self) -> sqlite3.Connection:
        """The store's ``sqlite3`` connection (blocking: prefer :meth:`execute`)."""
        return self._db.conn

    async def execute(self, sql: str, params: Params = None) -> list[tuple[Any, ...]]:
        """Run one statement of the job's in the transaction; return its rows."""
        self._check()
        self.statements.append((sql, params))
        return await self._db.step(
            self.opened.job_key,
            lambda conn: conn.execute(sql, params or ()).fetchall(),
            theirs=True,
        )

    async def commit(
        self, request: CompletionRequest, messages: Sequence[Message]
    ) -> CompletionResult:
        """Record the completion and the messages, then commit (or roll back if refused)."""
        self._check()
        self._done = True
        params = completion_params(request)
        rows = outbox_params(request, messages)
        answer = await self._db.step(request.job_key, lambda c: _commit(c, request, params, rows))
        deadline = time.monotonic() + self._db.timeout
        # on disk, or the offset waits
        await self._db.settle(request.job_key, deadline, settled=self._settled)
        return answer

    def _check(self) -> None:
        if self._done or self.opened.status != "claimed":
            raise StoreUnavailable(self.opened.job_key, "the transaction is not open")


def _commit(
    conn: sqlite3.Connection,
    request: CompletionRequest,
    params: dict[str, Any],
    rows: list[dict[str, Any]],
) -> CompletionResult:
    answer = _complete(conn, request, params)
    if answer.status != "accepted":
        conn.execute("ROLLBACK")
        return answer
    now = time.time_ns() // 1000
    conn.executemany(_INSERT, [{**row, "now": now} for row in rows])
    conn.execute("COMMIT")
    return answer


def claimable(conn: sqlite3.Connection, relay: str, limit: int) -> list[int]:
    """Return the ids ``relay`` could claim now (a read: the claim itself re-reads them)."""
    unsent = conn.execute(_UNSENT, (limit * SCAN,)).fetchall()
    return pick_claims(unsent, relay, now=time.time_ns() // 1000, limit=limit)


def claim_outbox(conn: sqlite3.Connection, relay: str, limit: int, hold: float) -> list[OutboxRow]:
    """Claim as ``EffectStore.claim_outbox`` says; runs in a batch's write transaction."""
    now = time.time_ns() // 1000
    ids = claimable(conn, relay, limit)
    if not ids:
        return []
    marks = ",".join("?" * len(ids))
    until = now + int(hold * 1_000_000)
    found = conn.execute(
        "UPDATE leaseworker_outbox SET claimed_by = ?, claimed_until = ?, attempts = attempts + 1"
        f" WHERE id IN ({marks}) RETURNING {_COLUMNS}",
        (relay, until, *ids),
    ).fetchall()
    return sorted((outbox_row(row) for row in found), key=lambda row: row.id)


def mark_sent(conn: sqlite3.Connection, relay: str, ids: Sequence[int]) -> int:
    """Mark ``relay``'s claimed rows sent; runs in a batch's write transaction."""
    marks = ",".join("?" * len(ids))
    return conn.execute(
        f"UPDATE leaseworker_outbox SET sent_at = ? WHERE id IN ({marks})"
        " AND claimed_by = ? AND sent_at IS NULL",
        (time.time_ns() // 1000, *ids, relay),
    ).rowcount


def release(conn: sqlite3.Connection, relay: str, ids: Sequence[int]) -> int:
    """Drop ``relay``'s claims on ``ids``; runs in a batch's write transaction."""
    marks = ",".join("?" * len(ids))
    return conn.execute(
        "UPDATE leaseworker_outbox SET claimed_by = NULL, claimed_until = NULL"
        f" WHERE id IN ({marks}) AND claimed_by = ? AND sent_at IS NULL",
        (*ids, relay),
    ).rowcount


def prune(conn: sqlite3.Connection, older_than: float, limit: int) -> int:
    """Delete old sent rows as ``EffectStore.prune_outbox`` says; runs in a write batch."""
    cutoff = time.time_ns() // 1000 - int(older_than * 1_000_000)
    return conn.execute(
        "DELETE FROM leaseworker_outbox WHERE id IN (SELECT id FROM leaseworker_outbox"
        " WHERE sent_at IS NOT NULL ORDER BY id LIMIT ?) AND sent_at < ?",
        (limit, cutoff),
    ).rowcount


def entries(conn: sqlite3.Connection, job_key: str | None) -> list[OutboxEntry]:
    """Every outbox row (of ``job_key``) with its state."""
    where, args = ("WHERE job_key = ?", (job_key,)) if job_key is not None else ("", ())
    found = conn.execute(
        f"SELECT {_COLUMNS}, committed_at, sent_at, attempts,"
        f" CASE WHEN sent_at IS NOT NULL THEN claimed_by END FROM leaseworker_outbox {where}"
        " ORDER BY id",
        args,
    ).fetchall()
    return [
        OutboxEntry(
            row=outbox_row(row[:-4]),
            committed_at=_utc(row[-4]),
            sent_at=None if row[-3] is None else _utc(row[-3]),
            attempts=row[-2],
            sent_by=row[-1],
        )
        for row in found
    ]


def backlog(conn: sqlite3.Connection, prefix: str = "") -> tuple[int, float | None]:
    """Return the unsent rows' count (of job keys starting with ``prefix``), the oldest's age."""
    count, oldest = conn.execute(
        "SELECT count(*), min(committed_at) FROM leaseworker_outbox"
        " WHERE sent_at IS NULL AND substr(job_key, 1, ?) = ?",
        (len(prefix), prefix),
    ).fetchone()
    if not count:
        return 0, None
    return count, max(0.0, (time.time_ns() // 1000 - oldest) / 1e6)


def _utc(micros: int) -> datetime:
    return datetime.fromtimestamp(micros / 1e6, UTC)
