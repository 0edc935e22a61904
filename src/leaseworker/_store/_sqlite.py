"""The embedded completion store: SQLite through the standard library's ``sqlite3``.

The default when no database URL is given: one file, no server. One
connection does all the work, one call at a time (a capacity limiter of one),
in a worker thread (``anyio.to_thread.run_sync``) so the event loop never
blocks on disk. A private ``:memory:`` database has no disk and no other
process to wait for, so its calls run on the event loop itself: a hop to a
thread and back costs ten times the query and, under load, GIL hand-overs
of milliseconds. The database runs in WAL mode with ``synchronous=FULL``: a
completion is on disk when ``complete()`` returns.

Why ``complete()`` is race-free: its transaction starts with ``BEGIN
IMMEDIATE``, which takes SQLite's write lock before the first statement, so
one writer's statements can never interleave with another's, whether the
other is a task of this process (already serialised by the limiter) or
another process on the same file (it waits for the lock, up to the timeout).
The fencing rule (:func:`~._model.decide`) is written as two conditional
writes rather than reads then writes, which halves the statements per
completion: the completion row is inserted unless its identity exists
(``duplicate``), then the head moves unless a higher fence holds it
(``stale``). A refused attempt reads what stands and rolls back, so only
``accepted`` writes anything.

Bounds: the wait for the connection is bounded by the store's timeout; inside
the thread ``busy_timeout`` bounds waiting for another process's lock, and a
progress handler aborts any statement still running at the deadline. Any
error rolls the transaction back before it is translated.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Concatenate, ParamSpec, TypeVar, final

import anyio

from .._errors import StoreUnavailable
from ._model import (
    Completion,
    CompletionResult,
    JsonValue,
    Status,
    check_call,
    completion_params,
)
from ._schema import MIGRATIONS, Migration, pending
from ._url import StoreURL

logger = logging.getLogger("leaseworker.store")

_T = TypeVar("_T")
_P = ParamSpec("_P")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_PROGRESS_EVERY = 1000  # SQLite VM instructions between deadline checks

_HEAD = "SELECT fence, input_version FROM leaseworker_jobs WHERE job_key = ?"
_FIND = """
    SELECT input_version, fence, result, execution_id, pod, completed_at
    FROM leaseworker_completions WHERE job_key = ? AND input_version = ?
"""
# Both writes bind :job_key, :input_version, :fence, :result, :execution_id,
# :pod and :now. The first changes no row when the identity completed already;
# the second none when a higher fence was accepted (an equal one may move it).
_RECORD_NEW = """
    INSERT INTO leaseworker_completions
        (job_key, input_version, fence, result, execution_id, pod, completed_at)
    VALUES (:job_key, :input_version, :fence, :result, :execution_id, :pod, :now)
    ON CONFLICT (job_key, input_version) DO NOTHING
"""
_ADVANCE_HEAD = """
    INSERT INTO leaseworker_jobs (job_key, fence, input_version, updated_at)
    VALUES (:job_key, :fence, :input_version, :now)
    ON CONFLICT (job_key) DO UPDATE SET
        fence = excluded.fence,
        input_version = excluded.input_version,
        updated_at = excluded.updated_at
    WHERE excluded.fence >= leaseworker_jobs.fence
"""
_STATE = """
    SELECT c.input_version, c.fence, c.result, c.execution_id, c.pod, c.completed_at
    FROM leaseworker_jobs j
    JOIN leaseworker_completions c
      ON c.job_key = j.job_key AND c.input_version = j.input_version
    WHERE j.job_key = ?
"""
_VERSION_TABLE = """
    CREATE TABLE IF NOT EXISTS leaseworker_schema_version (
        version     INTEGER PRIMARY KEY,
        description TEXT NOT NULL,
        applied_at  INTEGER NOT NULL
    )
"""


@final
class SqliteStore:
    """Completions in a SQLite file; open it with ``open_store("sqlite:///path")``.

    ``call_timeout`` bounds every call, including the wait for the connection while
    another call uses it. ``schema_version`` is the database's schema version
    after the start-up migration.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        shown_url: str,
        call_timeout: float,
        inline: bool = False,
    ) -> None:
        self._conn = conn
        self._inline = inline  # a :memory: database: nothing to block on
        self._shown_url = shown_url
        self._timeout = call_timeout
        self._limiter = anyio.CapacityLimiter(1)
        self._deadline = 0.0  # of the call running now (time.monotonic())
        # Installed once: SQLite calls it every _PROGRESS_EVERY VM steps of any
        # statement, and a true answer aborts the statement (the call's deadline).
        conn.set_progress_handler(self._expired, _PROGRESS_EVERY)
        self.schema_version = 0

    @classmethod
    async def open(
        cls, url: StoreURL, *, call_timeout: float, migrations: Sequence[Migration] = MIGRATIONS
    ) -> SqliteStore:
        """Open the file (WAL mode), then create or migrate the schema."""
        try:
            conn = await anyio.to_thread.run_sync(_connect, url.target, call_timeout)
        except sqlite3.Error as exc:
            raise StoreUnavailable(None, f"cannot open {url.redacted}: {_first_line(exc)}") from exc
        store = cls(
            conn,
            shown_url=url.redacted,
            call_timeout=call_timeout,
            inline=url.target == ":memory:",
        )
        try:
            store.schema_version = await store._run(None, _migrate, migrations)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await store.aclose()
            raise
        return store

    async def complete(
        self,
        job_key: str,
        *,
        input_version: str,
        fence: int,
        result: JsonValue,
        execution_id: str,
        pod: str,
    ) -> CompletionResult:
        """Record a completion if the fence allows; see ``CompletionStore.complete``."""
        params = completion_params(
            job_key,
            input_version=input_version,
            fence=fence,
            result=result,
            execution_id=execution_id,
            pod=pod,
        )
        return await self._run(job_key, _complete, params)

    async def lookup(self, job_key: str, input_version: str) -> Completion | None:
        """Return this identity's completion, or ``None``."""
        check_call(job_key, 0)
        return await self._run(job_key, _find, job_key, input_version)

    async def state(self, job_key: str) -> Completion | None:
        """Return the job key's winning completion, or ``None``."""
        check_call(job_key, 0)

        def read(conn: sqlite3.Connection) -> Completion | None:
            row = conn.execute(_STATE, (job_key,)).fetchone()
            return None if row is None else _completion(job_key, row)

        return await self._run(job_key, read)

    async def aclose(self) -> None:
        """Close the connection once the call using it (if any) has finished."""
        async with self._limiter:
            await anyio.to_thread.run_sync(self._conn.close)

    def __repr__(self) -> str:
        return f"SqliteStore(url={self._shown_url!r}, call_timeout={self._timeout})"

    async def _run(
        self,
        key: str | None,
        op: Callable[Concatenate[sqlite3.Connection, _P], _T],
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> _T:
        """Run ``op`` on the connection in a worker thread, under one deadline."""
        deadline = time.monotonic() + self._timeout
        if self._inline:
            await anyio.lowlevel.checkpoint_if_cancelled()  # no I/O, so no trip through the loop
            self._deadline = deadline
            try:
                return op(self._conn, *args, **kwargs)
            except sqlite3.Error as exc:
                raise StoreUnavailable(key, _first_line(exc)) from exc
        try:
            with anyio.fail_after(self._timeout):
                await self._limiter.acquire()
        except TimeoutError as exc:
            raise StoreUnavailable(key, f"connection still busy after {self._timeout}s") from exc
        try:
            # Not abandoned on cancel: the connection must not be reused while a
            # thread still runs on it. The deadline inside bounds the wait.
            bound = functools.partial(op, self._conn, *args, **kwargs)
            return await anyio.to_thread.run_sync(self._bounded, bound, deadline)
        except sqlite3.Error as exc:
            expired = time.monotonic() >= deadline
            detail = f"no answer within {self._timeout}s" if expired else _first_line(exc)
            raise StoreUnavailable(key, detail) from exc
        finally:
            self._limiter.release()

    def _bounded(self, op: Callable[[], _T], deadline: float) -> _T:
        """Run ``op`` (in the worker thread) with lock waits cut off at ``deadline``.

        Only a file is shared with other connections, so only the threaded
        path sets the lock-wait timeout (a PRAGMA parsed anew on every call, the
        costliest part of a small call); the progress handler cuts statements
        off in both paths.
        """
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        if remaining_ms <= 0:
            raise sqlite3.OperationalError("deadline passed before the call started")
        self._conn.execute(f"PRAGMA busy_timeout = {remaining_ms}")
        self._deadline = deadline
        return op()

    def _expired(self) -> bool:
        """Tell SQLite (as its progress handler) whether the running call's deadline passed."""
        return time.monotonic() > self._deadline


def _connect(path: str, call_timeout: float) -> sqlite3.Connection:
    """Open ``path`` for use from worker threads, in autocommit mode, WAL journal."""
    conn = sqlite3.connect(
        path, timeout=call_timeout, isolation_level=None, check_same_thread=False
    )
    try:
        if path != ":memory:":
            _enable_wal(conn, deadline=time.monotonic() + call_timeout)
        conn.execute("PRAGMA synchronous = FULL")
    except BaseException:
        conn.close()
        raise
    return conn


def _enable_wal(conn: sqlite3.Connection, *, deadline: float) -> None:
    """Switch the file to WAL, retrying while other first openers hold the lock.

    Changing the journal mode takes an exclusive lock, and SQLite answers
    "database is locked" at once, without waiting in its busy handler, when
    waiting could deadlock with another connection doing the same: several
    pods opening a new store file together.
    """
    while True:
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            break
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)  # a worker thread: the event loop is not blocked
    if str(mode).lower() != "wal":
        logger.warning("completion store: SQLite refused WAL mode (journal_mode=%s)", mode)


@contextlib.contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE``; roll back on any error (``ROLLBACK`` errors are secondary)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


def _complete(conn: sqlite3.Connection, params: dict[str, Any]) -> CompletionResult:
    job_key, input_version, fence = params["job_key"], params["input_version"], params["fence"]
    params["now"] = now = time.time_ns() // 1000
    status: Status
    with _immediate(conn):
        if conn.execute(_RECORD_NEW, params).rowcount == 0:
            status = "duplicate"
        elif conn.execute(_ADVANCE_HEAD, params).rowcount == 0:
            status = "stale"
        else:
            conn.execute("COMMIT")
            return CompletionResult(
                status="accepted",
                job_key=job_key,
                input_version=input_version,
                fence=fence,
                winning_fence=fence,
                completion=Completion(
                    job_key=job_key,
                    input_version=input_version,
                    fence=fence,
                    result=json.loads(params["result"]),
                    execution_id=params["execution_id"],
                    pod=params["pod"],
                    completed_at=_EPOCH + timedelta(microseconds=now),
                ),
            )
        # Refused: read what stands (a stale attempt's own row is still visible
        # but never the head's), then undo.
        head_fence, head_version = conn.execute(_HEAD, (job_key,)).fetchone()
        winner = _find(conn, job_key, input_version if status == "duplicate" else head_version)
        assert winner is not None  # the head always points at a recorded completion
        conn.execute("ROLLBACK")
    return CompletionResult(
        status=status,
        job_key=job_key,
        input_version=input_version,
        fence=fence,
        winning_fence=head_fence,
        completion=winner,
    )


def _find(conn: sqlite3.Connection, job_key: str, input_version: str) -> Completion | None:
    row = conn.execute(_FIND, (job_key, input_version)).fetchone()
    return None if row is None else _completion(job_key, row)


def _completion(job_key: str, row: tuple[Any, ...]) -> Completion:
    input_version, fence, result, execution_id, pod, completed_at = row
    return Completion(
        job_key=job_key,
        input_version=input_version,
        fence=fence,
        result=json.loads(result),
        execution_id=execution_id,
        pod=pod,
        completed_at=_EPOCH + timedelta(microseconds=completed_at),
    )


def _migrate(conn: sqlite3.Connection, migrations: Sequence[Migration]) -> int:
    """Apply missing migrations inside ``BEGIN IMMEDIATE``; return the schema version."""
    with _immediate(conn):
        conn.execute(_VERSION_TABLE)
        applied = int(
            conn.execute(
                "SELECT coalesce(max(version), 0) FROM leaseworker_schema_version"
            ).fetchone()[0]
        )
        for migration in pending(applied, migrations):
            for statement in migration.sqlite:
                conn.execute(statement)
            conn.execute(
                "INSERT INTO leaseworker_schema_version (version, description, applied_at)"
                " VALUES (?, ?, ?)",
                (migration.version, migration.description, time.time_ns() // 1000),
            )
            logger.info(
                "completion store: applied schema version %d (%s)",
                migration.version,
                migration.description,
            )
        conn.execute("COMMIT")
    return max([applied, *(m.version for m in migrations)])


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
