"""The SQLite store's one connection: its calls batched, each under a deadline, made durable.

:class:`SqliteConnection` is what the store's parts share (the calls of
:mod:`._sqlite_store`, the jobs' transactions of :mod:`._sqlite_effects`): a
file in WAL mode, one connection, group commit through :mod:`.._batch`, and
``BEGIN IMMEDIATE`` so the fencing rule is race-free. Batches run on the
event loop while the file's write lock is free (their commits do not fsync;
the writes of one loop pass commit together at the next) and on a worker
thread when they must wait for it; :mod:`._sqlite_sync` fsyncs. An answer
waits for the fsync unless its caller says its offset commit will
(``settled``: a pod's trigger); :meth:`SqliteConnection.durable` is that
offset's barrier. See docs/design.md#the-sqlite-store.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TypeVar, final

import anyio

from ..._errors import StoreUnavailable
from .._group_commit import Batcher, Call
from .._migration import Migration
from .._schema import MIGRATIONS
from .._url import StoreURL
from ._sqlite_many import run_all
from ._sqlite_sync import WalSync, connect, immediate, locked, migrate

logger = logging.getLogger("leaseworker.store")

_T = TypeVar("_T")
_PROGRESS_EVERY = 1000  # SQLite VM instructions between deadline checks
MAX_BATCH = 64  # calls per trip to the database


@final
class SqliteConnection:
    """A SQLite store's connection; :meth:`open` it, :meth:`run` its calls, :meth:`close` it.

    ``call_timeout`` bounds every call, including its wait in the queue while
    an earlier batch uses the connection. ``schema_version`` is the
    database's schema version after the start-up migration.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        shown_url: str,
        call_timeout: float,
        inline: bool = False,
        sync: WalSync | None = None,
    ) -> None:
        self.conn = conn
        self._inline = inline  # a :memory: database: nothing to block on
        self._sync = sync  # a WAL file committed without fsync: answers wait for it
        self.shown_url = shown_url
        self.timeout = call_timeout
        self._batcher = Batcher(self._run_batch_anywhere, max_batch=MAX_BATCH, inline=inline)
        self._deadline = 0.0  # of the batch running now (time.monotonic())
        self._busy_ms = -1  # the connection's busy_timeout as last set (-1: not yet)
        self._turn: list[Call[object]] = []  # writes to commit at the next loop pass
        # Installed once: SQLite calls it every _PROGRESS_EVERY VM steps of any
        # statement, and a true answer aborts the statement (the batch's deadline).
        conn.set_progress_handler(self._expired, _PROGRESS_EVERY)
        self.schema_version = 0

    @classmethod
    async def open(
        cls,
        url: StoreURL,
        *,
        call_timeout: float,
        migrations: Sequence[Migration] = MIGRATIONS,
        oldest_beside: int = 0,
    ) -> SqliteConnection:
        """Open the file (WAL mode), then create or migrate the schema.

        A directory that does not exist is a setting no retry can fix:
        :class:`ConfigError`; other failures are :class:`StoreUnavailable`.
        """
        try:
            conn, wal = await anyio.to_thread.run_sync(connect, url.target, call_timeout)
        except sqlite3.Error as exc:
            raise StoreUnavailable(None, f"cannot open {url.redacted}: {first_line(exc)}") from exc
        try:
            sync = await anyio.to_thread.run_sync(WalSync.start, url.target) if wal else None
        except OSError as exc:  # no process for the fsyncs
            conn.close()
            raise StoreUnavailable(None, f"cannot open {url.redacted}: {first_line(exc)}") from exc
        db = cls(
            conn,
            shown_url=url.redacted,
            call_timeout=call_timeout,
            inline=url.target == ":memory:",
            sync=sync,
        )
        where = f"completion store at {url.redacted}"
        try:
            db.schema_version = await db.run(
                None, lambda conn: migrate(conn, migrations, where, oldest_beside), writes=False
            )
        except BaseException:
            with anyio.CancelScope(shield=True):
                await db.close()
            raise
        return db

    def exclusive(self) -> AbstractAsyncContextManager[None]:
        """Hold the connection alone: no batch runs until the block ends (a job's transaction)."""
        return self._batcher.exclusive()

    async def close(self) -> None:
        """Close the connection once the call using it (if any) has finished."""
        await self._batcher.close(functools.partial(anyio.to_thread.run_sync, self._close))

    def _close(self) -> None:
        if self._sync is not None:
            self._sync.close()
        self.conn.close()

    async def run(
        self,
        key: str | None,
        op: Callable[[sqlite3.Connection], _T],
        *,
        writes: bool,
        lasting: Callable[[_T], bool] | None = None,
        settled: bool = False,
    ) -> _T:
        """Queue ``op(conn)`` for the next batch and return its outcome.

        ``writes``: run it in the batch's write transaction (``op`` must not
        manage transactions); otherwise on its own, in autocommit mode. The
        outcome is returned once it is on disk if ``lasting(outcome)`` (by
        default, when it wrote or found something), unless ``settled``: the
        caller's offset commit waits for the disk instead (:meth:`durable`).
        """
        deadline = time.monotonic() + self.timeout
        try:
            try:
                if writes and self._sync is not None:
                    outcome = await self._in_turn(op, deadline)
                else:
                    outcome = self._at_once(op, deadline)
            except _Busy:  # queued: a batch runs, or another connection holds the lock
                call: Call[_T] = Call(op, writes, deadline)
                outcome = await self._batcher.submit(call)
            durable = (writes or bool(outcome)) if lasting is None else lasting(outcome)
            if durable and self._sync is not None and not settled:
                await self._sync.wait(self._sync.mark(), deadline)
        except (sqlite3.Error, OSError) as exc:  # TimeoutError is an OSError
            expired = time.monotonic() >= deadline
            detail = f"no answer within {self.timeout}s" if expired else first_line(exc)
            raise StoreUnavailable(key, detail) from exc
        return outcome

    async def durable(self) -> None:
        """Return once every commit to the file so far, any connection's, is on disk.

        The pod's offset barrier; :class:`StoreUnavailable` if the fsync failed or was late.
        """
        await self.settle(None, time.monotonic() + self.timeout, barrier=True)

    async def settle(
        self, key: str | None, deadline: float, *, barrier: bool = False, settled: bool = False
    ) -> None:
        """Return once the commits so far are on disk, unless ``settled`` (see :meth:`run`)."""
        if self._sync is not None and (barrier or not settled):
            try:
                await self._sync.wait(self._sync.mark(), deadline)
            except OSError as exc:
                raise StoreUnavailable(key, first_line(exc)) from exc

    async def step(
        self, key: str, op: Callable[[sqlite3.Connection], _T], *, theirs: bool = False
    ) -> _T:
        """Run ``op(conn)`` of a job's transaction under the store's timeout, off the loop.

        SQLite's errors become :class:`StoreUnavailable`, but with ``theirs``
        (the job's own statement) those other than operational ones (locks,
        deadlines, I/O) are the job's and pass through unchanged. The caller
        holds the connection (:meth:`exclusive`).
        """

        def run() -> _T:
            self._deadline = time.monotonic() + self.timeout
            if not self._inline:
                self._bound_lock_waits(max(1, int(self.timeout * 1000)))
            return op(self.conn)

        try:
            return run() if self._inline else await anyio.to_thread.run_sync(run)
        except sqlite3.Error as exc:
            if theirs and not isinstance(exc, sqlite3.OperationalError):
                raise
            raise StoreUnavailable(key, first_line(exc)) from exc

    async def _in_turn(self, op: Callable[[sqlite3.Connection], _T], deadline: float) -> _T:
        """Run the write ``op`` in the transaction that commits the writes of this loop pass.

        The writes that tasks make in one pass of the event loop (a poll's
        cohort claiming, the jobs that ended completing) share one commit,
        made at the start of the next pass (:meth:`_commit_turn`). Raises
        :class:`_Busy`, having run nothing, when they must queue instead.
        """
        call: Call[_T] = Call(op, True, deadline)
        loop = asyncio.get_running_loop()
        if not self._turn:
            loop.call_soon(self._commit_turn)
        self._turn.append(call)  # type: ignore[arg-type]
        call.wake = wake = loop.create_future()
        try:
            await wake
        except asyncio.CancelledError:
            if not call.done and call in self._turn:  # not run: it leaves the pass's commit
                self._turn.remove(call)  # type: ignore[arg-type]
            raise  # run: the commit stands, as a batch's taken call does
        if not call.done:
            raise _Busy
        return call.answer()

    def _commit_turn(self) -> None:
        """Commit the writes queued in the last loop pass in one transaction, and wake them.

        Called by the loop (``call_soon``). Leaves the calls unanswered, to
        queue for a batch, when a batch or a job's transaction holds the
        connection or another connection holds the write lock.
        """
        calls, self._turn = self._turn[:MAX_BATCH], self._turn[MAX_BATCH:]
        if self._turn:  # the rest in the next pass: the loop runs other tasks between
            asyncio.get_running_loop().call_soon(self._commit_turn)
        try:
            # A caller cancelled meanwhile left: its wait was cancelled at once,
            # its task removes the call later.
            calls = [call for call in calls if call.wake is None or not call.wake.cancelled()]
            live = _started_in_time(calls, time.monotonic())
            if live and self._batcher.idle:
                self._deadline = min(call.deadline for call in live)
                self._bound_lock_waits(0)
                self._run_writes(live, patient=False)
        except BaseException as exc:  # delivered to each caller (not to the loop)
            for call in calls:
                if not call.done:
                    call.fail(exc)
        for call in calls:
            call.wake_up()

    def _at_once(self, op: Callable[[sqlite3.Connection], _T], deadline: float) -> _T:
        """Run the read ``op`` now, on the loop, in autocommit mode.

        Raises :class:`_Busy`, having run nothing, when the call must queue
        instead (not a WAL file, or a batch or a job's transaction runs).
        """
        if self._sync is None or not self._batcher.idle:
            raise _Busy
        self._deadline = deadline
        self._bound_lock_waits(0)
        try:
            return op(self.conn)
        except sqlite3.Error as exc:
            if locked(exc):
                raise _Busy from exc
            raise

    async def _run_batch_anywhere(self, batch: list[Call[object]]) -> None:
        """Run ``batch`` on the loop, or in a worker thread where it must wait for a lock.

        A private in-memory database has nothing to wait for; a WAL file
        committed without fsync only waits while another connection holds
        its write lock (then the calls go to the thread, which waits in
        SQLite's busy handler); a file of another journal mode fsyncs in
        every commit, so its batches always go to the thread.
        """
        if self._inline:
            self._run_batch(batch, patient=True)  # a private database: no lock to wait for
            return
        if self._sync is not None:
            batch = self._run_batch(batch, patient=False)
        if batch:
            await anyio.to_thread.run_sync(functools.partial(self._run_batch, batch, patient=True))

    def _run_batch(self, batch: list[Call[object]], *, patient: bool) -> list[Call[object]]:
        """Answer the calls of ``batch``: the writes in one transaction, reads one by one.

        Not ``patient``: never wait for another connection's lock; return
        the calls left unanswered because of one (none were run).
        """
        started = time.monotonic()
        live = _started_in_time(batch, started)
        if not live:
            return []
        self._deadline = min(call.deadline for call in live)
        if not self._inline:  # only a file has other connections to wait for
            self._bound_lock_waits(max(1, int((self._deadline - started) * 1000)) if patient else 0)
        writes = [call for call in live if call.writes]
        left = [] if self._run_writes(writes, patient=patient) else writes
        for call in live:
            if not call.writes:
                try:
                    call.succeed(call.op(self.conn))
                except sqlite3.Error as exc:
                    if patient or not locked(exc):
                        call.fail(exc)
                    else:
                        left.append(call)
        return left

    def _bound_lock_waits(self, remaining_ms: int) -> None:
        """Keep ``busy_timeout`` within the batch's deadline, and within half of it (0: none).

        Set again only when it would exceed the time left or wait less than
        half of it: one statement less in most batches.
        """
        if not remaining_ms // 2 <= self._busy_ms <= remaining_ms:
            self.conn.execute(f"PRAGMA busy_timeout = {remaining_ms}")
            self._busy_ms = remaining_ms

    def _run_writes(self, writes: list[Call[object]], *, patient: bool = True) -> bool:
        """Run ``writes`` in one transaction: all of them happen, or none (each then fails).

        Not ``patient``: return false, answering none, if another connection
        holds the write lock.
        """
        if not writes:
            return True
        try:
            with immediate(self.conn):
                outcomes = run_all(self.conn, [call.op for call in writes])
                self.conn.execute("COMMIT")
        except sqlite3.Error as exc:  # rolled back: none of them happened
            if not patient and locked(exc):
                return False
            for call in writes:
                call.fail(exc)
        else:
            for call, outcome in zip(writes, outcomes, strict=True):
                call.succeed(outcome)
        return True

    def _expired(self) -> bool:
        """Tell SQLite (as its progress handler) whether the running batch's deadline passed."""
        return time.monotonic() > self._deadline


class _Busy(Exception):
    """Another connection holds the write lock (or a batch runs): the call must queue."""


def _started_in_time(batch: list[Call[object]], started: float) -> list[Call[object]]:
    """Fail the calls whose deadline passed before the batch started; return the rest."""
    live = []
    for call in batch:
        if call.deadline <= started:
            call.fail(sqlite3.OperationalError("deadline passed before the call started"))
        else:
            live.append(call)
    return live


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
