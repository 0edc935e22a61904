"""The campaign's view of the store's outbox: its rows, an audit of its claims, lapsing them.

Read with the campaign's own SQL on its direct connection (not the pods'
proxy), so the checker judges the relays by the table itself. The audit
finds claims taken on a row already marked sent, the failure mode of
spring-modulith #1935: on its own store the campaign adds a trigger that
writes each into ``leaseworker_chaos_reclaims``; a store given by
``--store-url`` is left as it is and judged by its columns (a claim sets
``claimed_until`` to its time plus the hold, and nothing but a claim
changes a sent row's, so one above ``sent_at`` plus the hold was taken
after the mark). PostgreSQL's relays claim with row locks on the queue of
unsent ids (``leaseworker_outbox_unsent``), which write no column: a mark
deletes its rows from the queue in the transaction that records them sent,
so a sent message can be claimed again only if its id is queued again,
which the audit's second trigger records; both audits see any claim-column
write. On PostgreSQL the rows' state is read from ``leaseworker_outbox_state``.
:func:`lapse_claims` plays the ``outbox_claims_lapse`` fault: every claim
held now expires, as when a relay is frozen past its hold.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any

import anyio

from leaseworker.toolkit import CLAIM_HOLD, effect_id, open_store, parse_store_url

from ._campaign_records import Outboxed, Reclaim

_AUDIT_PG = (
    """
    CREATE TABLE IF NOT EXISTS leaseworker_chaos_reclaims (
        id bigint NOT NULL, claimed_by text, at timestamptz NOT NULL DEFAULT clock_timestamp()
    )
    """,
    """
    CREATE OR REPLACE FUNCTION leaseworker_chaos_reclaimed() RETURNS trigger
    LANGUAGE plpgsql AS $fn$
    BEGIN
        IF NOT EXISTS (SELECT 1 FROM leaseworker_outbox_unsent WHERE id = NEW.id) THEN
            INSERT INTO leaseworker_chaos_reclaims (id, claimed_by)
            VALUES (NEW.id, NEW.claimed_by);
        END IF;
        RETURN NEW;
    END
    $fn$
    """,
    "DROP TRIGGER IF EXISTS leaseworker_chaos_reclaims ON leaseworker_outbox",
    """
    CREATE TRIGGER leaseworker_chaos_reclaims
    AFTER UPDATE OF claimed_by, claimed_until ON leaseworker_outbox FOR EACH ROW
    WHEN (NEW.claimed_until IS DISTINCT FROM OLD.claimed_until)
    EXECUTE FUNCTION leaseworker_chaos_reclaimed()
    """,
    """
    CREATE OR REPLACE FUNCTION leaseworker_chaos_requeued() RETURNS trigger
    LANGUAGE plpgsql AS $fn$
    BEGIN
        INSERT INTO leaseworker_chaos_reclaims (id, claimed_by)
        SELECT NEW.id, 'queued again' FROM leaseworker_outbox_sent
        WHERE NEW.id = ANY (ids) LIMIT 1;
        RETURN NEW;
    END
    $fn$
    """,
    "DROP TRIGGER IF EXISTS leaseworker_chaos_requeued ON leaseworker_outbox_unsent",
    """
    CREATE TRIGGER leaseworker_chaos_requeued
    BEFORE INSERT ON leaseworker_outbox_unsent FOR EACH ROW
    EXECUTE FUNCTION leaseworker_chaos_requeued()
    """,
)
_AUDIT_SQLITE = (
    "CREATE TABLE IF NOT EXISTS leaseworker_chaos_reclaims (id INTEGER, claimed_by TEXT, at REAL)",
    """
    CREATE TRIGGER IF NOT EXISTS leaseworker_chaos_reclaims
    AFTER UPDATE OF claimed_by, claimed_until ON leaseworker_outbox
    WHEN OLD.sent_at IS NOT NULL AND NEW.claimed_until IS NOT OLD.claimed_until
    BEGIN
        INSERT INTO leaseworker_chaos_reclaims
        VALUES (NEW.id, NEW.claimed_by, (julianday('now') - 2440587.5) * 86400.0);
    END
    """,
)
_ROWS = """
    SELECT job_key, input_version, seq, fence, topic, committed_at, sent_at
    FROM {t} WHERE substr(job_key, 1, {n}) = {p} ORDER BY id
"""
_RECLAIMS = """
    SELECT o.job_key, o.input_version, o.seq, r.claimed_by, r.at
    FROM leaseworker_chaos_reclaims r JOIN leaseworker_outbox o ON o.id = r.id
    WHERE substr(o.job_key, 1, {n}) = {p} ORDER BY r.at
"""
_RECLAIMED_PG = """
    SELECT job_key, input_version, seq, claimed_by, claimed_until FROM leaseworker_outbox_state
    WHERE substr(job_key, 1, {n}) = {p} AND sent_at IS NOT NULL AND claimed_until < 'infinity'
      AND claimed_until > sent_at + make_interval(secs => %s) ORDER BY id
"""
_RECLAIMED_SQLITE = """
    SELECT job_key, input_version, seq, claimed_by, claimed_until FROM leaseworker_outbox
    WHERE substr(job_key, 1, {n}) = {p} AND sent_at IS NOT NULL
      AND claimed_until > sent_at + ? ORDER BY id
"""
CLOCK_SLACK = 0.001
"""Seconds a claim's time may exceed its row's ``sent_at`` and prove nothing.

One clock stamps both: PostgreSQL's, or the host's for SQLite (taken under its write lock).
"""
_LAPSE_PG = """
    UPDATE leaseworker_outbox SET claimed_until = now()
    WHERE sent_at IS NULL AND claimed_by IS NOT NULL AND claimed_until > now()
"""
# A relay's claim on PostgreSQL is row locks in a transaction of its own
# (application_name set for it): ending its session is what a hold that ran
# out does; the call waits (up to 1 s) until the session is gone.
_LAPSE_PG_LOCKS = """
    SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 1000)) FROM pg_stat_activity
    WHERE datname = current_database() AND application_name = 'leaseworker-relay-claim'
      AND pid <> pg_backend_pid()
"""
_LAPSE_SQLITE = """
    UPDATE leaseworker_outbox SET claimed_until = ?
    WHERE sent_at IS NULL AND claimed_by IS NOT NULL AND claimed_until > ?
"""


async def install_audit(store_url: str) -> None:
    """Create the store's schema (the outbox) if need be, then the reclaim audit's trigger."""
    async with open_store(store_url):
        pass  # opening migrates: the outbox table exists from here on
    async with _connected(store_url) as (conn, pg):
        for statement in _AUDIT_PG if pg else _AUDIT_SQLITE:
            await _execute(conn, pg, statement)


async def outbox_rows(store_url: str, namespace: str) -> tuple[Outboxed, ...]:
    """Return the campaign's outbox rows (its namespace's), in commit order."""
    prefix = f"{namespace}:"
    async with _connected(store_url) as (conn, pg):
        found = await _execute(conn, pg, _scoped(_ROWS, pg, prefix), (prefix,))
    return tuple(
        Outboxed(
            effect_id=effect_id(key, version, seq),
            job_key=_user_key(key, prefix),
            input_version=version,
            fence=int(fence),
            topic=topic,
            committed=_seconds(committed),
            sent=None if sent is None else _seconds(sent),
        )
        for key, version, seq, fence, topic, committed, sent in found
    )


def topics_of(store_url: str, namespace: str) -> Callable[[], Awaitable[set[str]]]:
    """Return a reader of the topics the campaign's outbox rows go to (the receiver's)."""

    async def read() -> set[str]:
        return {row.topic for row in await outbox_rows(store_url, namespace)}

    return read


async def reclaims(
    store_url: str, namespace: str, *, audited: bool = True, hold: float = CLAIM_HOLD
) -> tuple[Reclaim, ...]:
    """Return the claims taken on messages already sent (see the module docstring).

    ``audited``: the audit trigger's records; else the columns' evidence, for
    relays that claim for ``hold`` seconds (a claim's ``at`` is its time).
    """
    prefix = f"{namespace}:"
    async with _connected(store_url) as (conn, pg):
        if audited:
            found = await _execute(conn, pg, _scoped(_RECLAIMS, pg, prefix), (prefix,))
            return tuple(
                Reclaim(effect_id=effect_id(key, version, seq), relay=relay, at=_seconds(at))
                for key, version, seq, relay, at in found
            )
        past = hold + CLOCK_SLACK
        sql = _scoped(_RECLAIMED_PG if pg else _RECLAIMED_SQLITE, pg, prefix)
        found = await _execute(conn, pg, sql, (prefix, past if pg else int(past * 1e6)))
    return tuple(
        Reclaim(effect_id=effect_id(key, version, seq), relay=relay, at=_seconds(until) - hold)
        for key, version, seq, relay, until in found
    )


async def lapse_claims(store_url: str, seconds: float, *, every: float = 0.05) -> int:
    """For ``seconds``, expire every relay claim on an unsent message; return how many lapsed."""
    lapsed = 0
    async with _connected(store_url) as (conn, pg):
        deadline = anyio.current_time() + seconds
        while True:  # every pass whole, the first even when ``seconds`` is shorter
            if pg:
                lapsed += int((await conn.execute(_LAPSE_PG)).rowcount)
                row = await (await conn.execute(_LAPSE_PG_LOCKS)).fetchone()
                lapsed += int(row[0]) if row else 0
            else:
                now = time.time_ns() // 1000
                lapsed += await anyio.to_thread.run_sync(_lapse_sqlite, conn, now)
            if anyio.current_time() + every >= deadline:
                return lapsed
            await anyio.sleep(every)


def _lapse_sqlite(conn: sqlite3.Connection, now: int) -> int:
    return int(conn.execute(_LAPSE_SQLITE, (now, now)).rowcount)


@contextlib.asynccontextmanager
async def _connected(store_url: str) -> AsyncIterator[tuple[Any, bool]]:
    """Yield an autocommit connection to the store and whether it is PostgreSQL."""
    parsed = parse_store_url(store_url)
    if parsed.backend == "postgresql":
        import psycopg  # the PostgreSQL extra: only for that store

        with anyio.fail_after(30):
            conn = await psycopg.AsyncConnection.connect(parsed.target, autocommit=True)
        async with conn:
            yield conn, True
        return
    # Used from worker threads (a locked file must not block the campaign's loop).
    lite = sqlite3.connect(parsed.target, isolation_level=None, timeout=30, check_same_thread=False)
    try:
        yield lite, False
    finally:
        lite.close()


async def _execute(conn: Any, pg: bool, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    if pg:
        with anyio.fail_after(30):
            cursor = await conn.execute(sql, params or None)
            return list(await cursor.fetchall()) if cursor.description else []
    return await anyio.to_thread.run_sync(lambda: list(conn.execute(sql, params).fetchall()))


def _scoped(sql: str, pg: bool, prefix: str) -> str:
    table = "leaseworker_outbox_state" if pg else "leaseworker_outbox"
    return sql.format(n=len(prefix), p="%s" if pg else "?", t=table)


def _user_key(store_key: str, prefix: str) -> str:
    """``{namespace}:{<job key>}`` back to the job key."""
    return store_key[len(prefix) :].removeprefix("{").removesuffix("}")


def _seconds(value: datetime | int | float) -> float:
    """Return a PostgreSQL timestamp, SQLite's microseconds (the audit's seconds) as Unix time."""
    if isinstance(value, datetime):
        return value.timestamp()
    return value / 1e6 if isinstance(value, int) else float(value)
