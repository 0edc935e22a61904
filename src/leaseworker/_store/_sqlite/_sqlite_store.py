"""The embedded completion store: SQLite through the standard library's ``sqlite3``.

The default when no database URL is given. :class:`SqliteStore` is the
``CompletionStore``: each call is a statement of :mod:`._sqlite_rules` (or
several of :mod:`._sqlite_many` at once) that :mod:`._sqlite_connection`
runs in its batches. An answer waits for the fsync, except from the view a
pod's triggers use (:meth:`SqliteStore.settled_by_offsets`): those answers
come at their commit, and the pod's offset commit awaits
:meth:`SqliteStore.durable`. See docs/design.md#the-sqlite-store.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import final

from .._bell import OutboxBell
from .._effect_rows import PRUNE_LIMIT, OutboxEntry, OutboxRow, StoreTransaction
from .._fencing import (
    ClaimResult,
    Completion,
    CompletionRequest,
    CompletionResult,
    check_call,
    completion_params,
)
from .._migration import Migration
from .._schema import MIGRATIONS
from .._url import StoreURL
from ._sqlite_connection import SqliteConnection
from ._sqlite_effects import (
    backlog,
    claim_outbox,
    claimable,
    entries,
    mark_sent,
    prune,
    release,
    transaction,
)
from ._sqlite_many import Claim, Record, find_many
from ._sqlite_rules import _any_found, _refused, _state


@final
class SqliteStore:
    """Completions in a SQLite file; open it with ``open_store("sqlite:///path")``.

    Its calls go through one :class:`SqliteConnection`, which bounds each of
    them and knows the database's schema version.
    """

    def __init__(
        self,
        db: SqliteConnection,
        *,
        bell: OutboxBell | None = None,
        settled_by_offsets: bool = False,
    ) -> None:
        self._db = db
        self.outbox_bell = OutboxBell() if bell is None else bell
        self._settled = settled_by_offsets  # answers may come before the fsync
        self._view: SqliteStore | None = self if settled_by_offsets else None

    @classmethod
    async def open(
        cls,
        url: StoreURL,
        *,
        call_timeout: float,
        migrations: Sequence[Migration] = MIGRATIONS,
        oldest_beside: int = 0,
    ) -> SqliteStore:
        """Open the file (WAL mode), then create or migrate the schema.

        A directory that does not exist is a setting no retry can fix:
        :class:`ConfigError`; other failures are :class:`StoreUnavailable`.
        ``oldest_beside``: as for :meth:`PostgresStore.open`.
        """
        connection = await SqliteConnection.open(
            url, call_timeout=call_timeout, migrations=migrations, oldest_beside=oldest_beside
        )
        return cls(connection)

    @property
    def schema_version(self) -> int:
        """The database's schema version after the start-up migration."""
        return self._db.schema_version

    def settled_by_offsets(self) -> SqliteStore:
        """Return this store as a pod's triggers use it: answers at the commit, not the fsync.

        The same connection, batches and bell; what it answers is on disk once
        :meth:`durable` returned, which the pod awaits before each offset
        commit. A crash before that loses the answer and the offset together:
        the trigger runs again. One view per store: every call returns it.
        """
        if self._view is None:
            self._view = SqliteStore(self._db, bell=self.outbox_bell, settled_by_offsets=True)
        return self._view

    async def durable(self) -> None:
        """Return once every commit to the file so far, any connection's, is on disk.

        The pod's offset barrier; :class:`StoreUnavailable` if the fsync failed or was late.
        """
        await self._db.durable()

    async def complete(self, request: CompletionRequest) -> CompletionResult:
        """Record a completion if the fence allows; see ``CompletionStore.complete``."""
        params = completion_params(request)
        record = Record(request, params)
        return await self._db.run(request.job_key, record, writes=True, settled=self._settled)

    async def claim(self, job_key: str, input_version: str, fence: int) -> ClaimResult:
        """Raise the job key's claimed fence to ``fence``; see ``CompletionStore.claim``."""
        check_call(job_key, fence, input_version)
        claim = Claim(job_key, input_version, fence)
        return await self._db.run(
            job_key, claim, writes=True, lasting=_refused, settled=self._settled
        )

    async def lookup(self, job_key: str, input_version: str) -> Completion | None:
        """Return this identity's completion, or ``None``."""
        return (await self.lookup_many([(job_key, input_version)]))[0]

    async def lookup_many(self, identities: Sequence[tuple[str, str]]) -> list[Completion | None]:
        """Return each identity's completion, or ``None``; see ``CompletionStore.lookup_many``.

        One call of the batch, outside its write transaction, one statement
        for up to 16; the answer waits for the fsync only if it found a
        completion (a duplicate must last).
        """
        for job_key, input_version in identities:
            check_call(job_key, 0, input_version)
        first = identities[0][0] if identities else None
        find = functools.partial(find_many, identities=identities)
        return await self._db.run(
            first, find, writes=False, lasting=_any_found, settled=self._settled
        )

    async def state(self, job_key: str) -> Completion | None:
        """Return the job key's winning completion, or ``None``."""
        check_call(job_key, 0)

        return await self._db.run(
            job_key, lambda conn: _state(conn, job_key), writes=False, settled=self._settled
        )

    def transaction(
        self,
        job_key: str,
        input_version: str,
        fence: int,
        *,
        budget: Callable[[], float] | None = None,
    ) -> AbstractAsyncContextManager[StoreTransaction]:
        """Begin a job's transaction; see ``EffectStore.transaction`` and ``_sqlite_effects``."""
        return transaction(self._db, job_key, input_version, fence, settled=self._settled)

    async def claim_outbox(self, relay: str, *, limit: int, hold: float) -> list[OutboxRow]:
        """Claim unsent messages; see ``EffectStore.claim_outbox``."""
        db, settled = self._db, self._settled
        # A read first: a relay with nothing to send never takes the write lock.
        if not await db.run(
            None, lambda c: claimable(c, relay, limit), writes=False, settled=settled
        ):
            return []
        return await db.run(
            None, lambda c: claim_outbox(c, relay, limit, hold), writes=True, settled=settled
        )

    async def mark_sent(self, relay: str, ids: Sequence[int]) -> int:
        """Mark claimed messages sent; see ``EffectStore.mark_sent``."""
        if not ids:
            return 0
        return await self._db.run(
            None, lambda c: mark_sent(c, relay, ids), writes=True, settled=self._settled
        )

    async def release_outbox(self, relay: str, ids: Sequence[int]) -> None:
        """Give up claims; see ``EffectStore.release_outbox``."""
        if ids:
            await self._db.run(
                None, lambda c: release(c, relay, ids), writes=True, settled=self._settled
            )

    async def outbox(self, job_key: str | None = None) -> list[tuple[OutboxRow, bool]]:
        """Every outbox row with whether it was sent; see ``EffectStore.outbox``."""
        return [(entry.row, entry.sent) for entry in await self.outbox_entries(job_key)]

    async def outbox_entries(self, job_key: str | None = None) -> list[OutboxEntry]:
        """Every outbox row with its state; see ``EffectStore.outbox_entries``."""
        return await self._db.run(
            job_key, lambda c: entries(c, job_key), writes=False, settled=self._settled
        )

    async def outbox_backlog(self, prefix: str = "") -> tuple[int, float | None]:
        """Unsent messages and the oldest one's age; see ``EffectStore.outbox_backlog``."""
        return await self._db.run(
            None, lambda c: backlog(c, prefix), writes=False, settled=self._settled
        )

    async def prune_outbox(self, older_than: float, *, limit: int = PRUNE_LIMIT) -> int:
        """Delete old sent messages; see ``EffectStore.prune_outbox``."""
        return await self._db.run(
            None, lambda c: prune(c, older_than, limit), writes=True, settled=self._settled
        )

    async def aclose(self) -> None:
        """Close the connection once the call using it (if any) has finished."""
        await self._db.close()

    def __repr__(self) -> str:
        return f"SqliteStore(url={self._db.shown_url!r}, call_timeout={self._db.timeout})"
