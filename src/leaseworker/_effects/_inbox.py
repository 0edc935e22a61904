"""Receivers' idempotent inbox: an effect is processed once, and never after a newer fence.

A consumer of an effects topic records each effect id in its own
transaction, with the writes the effect causes: a redelivered effect is a
``duplicate``; one whose fence is below the highest seen for its job key is
``stale`` (a superseded execution's, or one overtaken): fencing carried
downstream. One row per effect id and one per job key (its highest fence),
under the receiver's name, so several receivers can share a database.
An inbox's ``hooks`` get an ``EffectEvent`` (``received``) per answer: a
pod's telemetry counts them (``leaseworker.effects.received`` by status).
See docs/effects.md#what-a-receiver-must-do.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, final

from .._errors import ConfigError
from .._events import EffectEvent, Hook, Hooks, emit, hooks_for
from .._store import EFFECT_ID_HEADER, FENCE_HEADER, JOB_KEY_HEADER

EffectStatus = Literal["new", "duplicate", "stale"]
"""What the inbox says of an effect: process it (``new``) or drop it."""

_TABLES = (
    """
    CREATE TABLE IF NOT EXISTS leaseworker_inbox (
        receiver  text NOT NULL,
        effect_id text NOT NULL,
        job_key   text NOT NULL,
        fence     bigint NOT NULL,
        PRIMARY KEY (receiver, effect_id)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS leaseworker_inbox_fences (
        receiver text NOT NULL,
        job_key  text NOT NULL,
        fence    bigint NOT NULL,
        PRIMARY KEY (receiver, job_key)
    )
    """,
)
# Locks the job key's row and raises its fence: the fence it returns is above
# the effect's exactly when a higher one was seen before.
_RAISE = """
    INSERT INTO leaseworker_inbox_fences AS f (receiver, job_key, fence) VALUES (%s, %s, %s)
    ON CONFLICT (receiver, job_key) DO UPDATE SET fence = greatest(f.fence, EXCLUDED.fence)
    RETURNING f.fence
"""
_RAISE_SQLITE = """
    INSERT INTO leaseworker_inbox_fences (receiver, job_key, fence) VALUES (?, ?, ?)
    ON CONFLICT (receiver, job_key) DO UPDATE SET fence = max(fence, excluded.fence)
    RETURNING fence
"""
_RECORD = """
    INSERT INTO leaseworker_inbox (receiver, effect_id, job_key, fence) VALUES (%s, %s, %s, %s)
    ON CONFLICT (receiver, effect_id) DO NOTHING
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Effect:
    """What a message says of the effect it carries: its id, job key and fence."""

    effect_id: str
    job_key: str
    fence: int

    @classmethod
    def from_headers(cls, headers: Sequence[tuple[str, bytes | None]] | None) -> Effect | None:
        """Read a record's ``leaseworker-*`` headers; ``None`` if it carries no effect."""
        found = {name: value for name, value in headers or () if value is not None}
        try:
            return cls(
                effect_id=found[EFFECT_ID_HEADER].decode(),
                job_key=found[JOB_KEY_HEADER].decode(),
                fence=int(found[FENCE_HEADER]),
            )
        except (KeyError, ValueError):
            return None


def _status(
    inserted: bool, highest: int, effect: Effect, receiver: str, hooks: Hooks
) -> EffectStatus:
    status: EffectStatus = "duplicate"
    if inserted:
        status = "stale" if highest > effect.fence else "new"
    if hooks:
        event = EffectEvent(
            name="received",
            effect_id=effect.effect_id,
            job_key=effect.job_key,
            fence=effect.fence,
            receiver=receiver,
            status=status,
        )
        emit(hooks, event)
    return status


@final
class PostgresInbox:
    """The inbox in the receiver's PostgreSQL database, on its psycopg (async) connection.

    The connection must be in autocommit mode: on one that is not, the first
    statement opens a transaction that nothing commits, and each
    ``conn.transaction()`` is only a savepoint inside it. :meth:`setup` and
    :meth:`accept` raise :class:`~leaseworker.ConfigError` on such a connection.

    ::

        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        inbox = PostgresInbox("billing")
        await inbox.setup(conn)
        async with conn.transaction():
            if await inbox.accept(conn, Effect.from_headers(record.headers)) == "new":
                await conn.execute("INSERT INTO invoices ...")
    """

    def __init__(self, receiver: str, *, hooks: Iterable[Hook] = ()) -> None:
        self.receiver = receiver
        self._hooks = hooks_for(hooks, EffectEvent)

    async def setup(self, conn: Any) -> None:
        """Create the inbox's two tables if they do not exist."""
        _check_autocommit(conn)
        for statement in _TABLES:
            await conn.execute(statement)

    async def accept(self, conn: Any, effect: Effect) -> EffectStatus:
        """Record ``effect`` in the connection's open transaction; say whether to process it."""
        _check_autocommit(conn)
        cursor = await conn.execute(_RAISE, (self.receiver, effect.job_key, effect.fence))
        (highest,) = await cursor.fetchone()
        args = (self.receiver, effect.effect_id, effect.job_key, effect.fence)
        inserted = (await conn.execute(_RECORD, args)).rowcount == 1
        return _status(inserted, highest, effect, self.receiver, self._hooks)


def _check_autocommit(conn: Any) -> None:
    """Raise :class:`ConfigError` unless the psycopg connection ``conn`` is in autocommit mode."""
    if not conn.autocommit:
        raise ConfigError(
            "PostgresInbox needs a connection in autocommit mode (psycopg: connect(..., "
            "autocommit=True)); on this one each conn.transaction() is a savepoint of a "
            "transaction never committed"
        )


@final
class SqliteInbox:
    """The inbox in the receiver's SQLite database, on its ``sqlite3`` connection (blocking).

    Call :meth:`accept` inside the receiver's own transaction (``BEGIN
    IMMEDIATE``, so two receivers of one file serialise on the write lock).
    """

    def __init__(self, receiver: str, *, hooks: Iterable[Hook] = ()) -> None:
        self.receiver = receiver
        self._hooks = hooks_for(hooks, EffectEvent)

    def setup(self, conn: Any) -> None:
        """Create the inbox's two tables if they do not exist."""
        for statement in _TABLES:
            conn.execute(statement)

    def accept(self, conn: Any, effect: Effect) -> EffectStatus:
        """Record ``effect`` in the connection's open transaction; say whether to process it."""
        key = (self.receiver, effect.job_key, effect.fence)
        (highest,) = conn.execute(_RAISE_SQLITE, key).fetchone()
        args = (self.receiver, effect.effect_id, effect.job_key, effect.fence)
        inserted = conn.execute(_RECORD.replace("%s", "?"), args).rowcount == 1
        return _status(inserted, highest, effect, self.receiver, self._hooks)


@final
class MemoryInbox:
    """The inbox in this process's memory, for tests: the same answers, nothing durable."""

    def __init__(self, receiver: str = "memory", *, hooks: Iterable[Hook] = ()) -> None:
        self.receiver = receiver
        self._hooks = hooks_for(hooks, EffectEvent)
        self.seen: dict[str, Effect] = {}
        self.fences: dict[str, int] = {}

    def accept(self, effect: Effect) -> EffectStatus:
        """Record ``effect`` and say whether to process it."""
        highest = max(self.fences.get(effect.job_key, effect.fence), effect.fence)
        self.fences[effect.job_key] = highest
        inserted = effect.effect_id not in self.seen
        self.seen.setdefault(effect.effect_id, effect)
        return _status(inserted, highest, effect, self.receiver, self._hooks)
