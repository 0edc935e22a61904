"""Receivers' inbox on real PostgreSQL, real SQLite and in memory: duplicates and stale dropped.

The effect is recorded in the receiver's own transaction: rolled back with
it, it is ``new`` again on redelivery; committed, it is a ``duplicate``; a
fence below the highest seen for its job key is ``stale``.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from leaseworker import ConfigError
from leaseworker.effects import (
    EFFECT_ID_HEADER,
    FENCE_HEADER,
    JOB_KEY_HEADER,
    Effect,
    EffectStatus,
    MemoryInbox,
    PostgresInbox,
    SqliteInbox,
)


def effect(n: int, fence: int, key: str = "k") -> Effect:
    """Effect ``n`` of job key ``key`` at ``fence``."""
    return Effect(effect_id=f"lw1:{key}:{n}", job_key=key, fence=fence)


# (effect, whether the receiver's transaction commits, the expected answer)
SCRIPT: list[tuple[Effect, bool, EffectStatus]] = [
    (effect(0, 10), False, "new"),  # processed, then the receiver's transaction rolled back
    (effect(0, 10), True, "new"),  # so its redelivery is new again
    (effect(0, 10), True, "duplicate"),
    (effect(1, 12), True, "new"),  # a newer execution's effect
    (effect(2, 10), True, "stale"),  # the superseded execution's other effect, arriving late
    (effect(3, 12), True, "new"),
    (effect(0, 5, "other"), True, "new"),  # fences are per job key
]


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
async def test_the_inbox_answers_in_the_receivers_own_transaction(
    backend: str, store_url_for: Callable[[str], str]
) -> None:
    """Each step of ``SCRIPT`` gets its answer; a rolled-back receipt leaves nothing behind."""
    url = store_url_for(backend)
    if backend == "sqlite":
        path = url.removeprefix("sqlite:///")
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
            inbox = SqliteInbox("billing")
            inbox.setup(conn)
            for step, commit, expected in SCRIPT:
                conn.execute("BEGIN IMMEDIATE")
                assert inbox.accept(conn, step) == expected, step
                conn.execute("COMMIT" if commit else "ROLLBACK")
        return
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as pg:
        pg_inbox = PostgresInbox("billing")
        await pg_inbox.setup(pg)
        for step, commit, expected in SCRIPT:
            await pg.execute("BEGIN")
            assert await pg_inbox.accept(pg, step) == expected, step
            await pg.execute("COMMIT" if commit else "ROLLBACK")


async def test_the_postgres_inbox_refuses_a_connection_not_in_autocommit_mode(
    store_url_for: Callable[[str], str],
) -> None:
    """There each ``conn.transaction()`` would be a savepoint never committed: one line, no SQL.

    In autocommit mode the same calls record the effect, seen committed from
    another connection.
    """
    url = store_url_for("postgresql")
    inbox = PostgresInbox("billing")
    async with await psycopg.AsyncConnection.connect(url) as conn:
        for call in (inbox.setup(conn), inbox.accept(conn, effect(0, 10))):
            with pytest.raises(ConfigError, match="connection in autocommit mode") as raised:
                await call
            assert "\n" not in str(raised.value)
        assert conn.info.transaction_status == TransactionStatus.IDLE  # nothing was sent
        await conn.set_autocommit(True)
        await inbox.setup(conn)
        async with conn.transaction():
            assert await inbox.accept(conn, effect(0, 10)) == "new"
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as other:
        cursor = await other.execute("SELECT effect_id FROM leaseworker_inbox")
        assert await cursor.fetchall() == [("lw1:k:0",)]


def test_the_memory_inbox_gives_the_same_answers() -> None:
    """``MemoryInbox`` (no transactions: every receipt counts) answers as the databases do."""
    inbox = MemoryInbox()
    for step, _, expected in SCRIPT[1:]:
        assert inbox.accept(step) == expected, step


def test_effects_are_read_from_the_relays_headers() -> None:
    """The three ``leaseworker-*`` headers make an :class:`Effect`; a record without them, none."""
    headers = [
        (EFFECT_ID_HEADER, b"lw1:abc:0"),
        (JOB_KEY_HEADER, b"ns:{k}"),
        (FENCE_HEADER, b"42"),
        ("other", None),
    ]
    assert Effect.from_headers(headers) == Effect(effect_id="lw1:abc:0", job_key="ns:{k}", fence=42)
    assert Effect.from_headers([("other", b"x")]) is None
    assert Effect.from_headers([(EFFECT_ID_HEADER, b"e"), (JOB_KEY_HEADER, b"k")]) is None
