"""The SQLite store's file: how it is opened and migrated, its fsyncs and checkpoints.

The store's connection commits with ``synchronous=NORMAL`` (no fsync), so a
batch's statements and its ``COMMIT`` take microseconds and run on the loop.
What must last is on disk once :class:`WalSync` says so (an answer outside a
pod, a pod's offset commit): it has a helper process fsync the WAL file, one
fsync for every commit made before it started, and checkpoint the WAL into the database
(the connection's own automatic checkpoints, which would fsync on the loop,
are off). A process, not a thread: a thread must win the GIL back from a
busy loop after each fsync (measured: 1.3 ms each way per fsync of 1.7 ms).
See docs/design.md#the-sqlite-store.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import final

import anyio

from ..._errors import ConfigError
from .._migration import Migration
from .._schema import MARK, MARKS_ABOVE, mark, pending, refuse_newer, refuse_older

logger = logging.getLogger("leaseworker.store")

_VERSION_TABLE = """
    CREATE TABLE IF NOT EXISTS leaseworker_schema_version (
        version     INTEGER PRIMARY KEY,
        description TEXT NOT NULL,
        applied_at  INTEGER NOT NULL
    )
"""

CHECKPOINT_BYTES = 4 * 1024 * 1024
"""WAL size from which a sync also checkpoints (SQLite's own default is about 4 MB)."""

# The helper: for each byte read, fsync the WAL (the database file while there
# is none; fdatasync, as SQLite's own syncs on Linux: the data and its size,
# not the times) and answer b"k", or b"e" if that failed; once the WAL has grown,
# checkpoint it (PASSIVE: never blocks writers; its connection's default
# synchronous=FULL fsyncs the WAL before and the database after copying).
# It exits when its stdin closes: the pod closed the store, or died.
_HELPER = """
import os, sqlite3, sys
path, limit = sys.argv[1], int(sys.argv[2])
sync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync
checkpointer = None
while os.read(0, 1):
    try:
        try:
            fd = os.open(path + "-wal", os.O_RDONLY)
        except FileNotFoundError:
            fd = os.open(path, os.O_RDONLY)
        try:
            sync(fd)
            grown = os.fstat(fd).st_size >= limit
        finally:
            os.close(fd)
    except OSError:
        os.write(1, b"e")
        continue
    os.write(1, b"k")
    if grown:
        try:
            checkpointer = checkpointer or sqlite3.connect(path, timeout=0, isolation_level=None)
            checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error:
            pass  # another connection checkpoints, or the next sync tries again
"""


@final
class WalSync:
    """Make commits durable: ``target = mark()`` after a statement ran, then ``await wait(...)``.

    ``mark()`` asks for an fsync that starts after now; ``wait`` returns once
    one has finished. A waiter leads the next fsync when none is running, so
    a commit made while one runs waits for the next, which covers every
    commit made meanwhile, this pod's and other connections' alike.
    Open with :meth:`start` (from a worker thread: it starts the helper).
    """

    def __init__(self, helper: subprocess.Popen[bytes]) -> None:
        self._helper = helper
        assert helper.stdin is not None
        assert helper.stdout is not None
        self._ask, self._told = helper.stdin.fileno(), helper.stdout.fileno()
        os.set_blocking(self._told, False)
        self._asked = 0  # generations marked (one per answer that must be durable)
        self._durable = 0  # generations covered by a finished fsync
        self._running: anyio.Event | None = None  # set when the fsync in flight ends
        self._owed = 0  # answers the helper has yet to give (a sync abandoned at its deadline)
        self.syncs = 0

    @classmethod
    def start(cls, path: str) -> WalSync:
        """Start the helper process for the database file at ``path``."""
        helper = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _HELPER, path, str(CHECKPOINT_BYTES)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            close_fds=True,
        )
        return cls(helper)

    def mark(self) -> int:
        """Return the generation an answer given now must wait for."""
        self._asked += 1
        return self._asked

    async def wait(self, target: int, deadline: float) -> None:
        """Return once a sync that began after ``mark()`` returned ``target`` has finished.

        Raises ``OSError`` if the fsync failed (the commit may or may not be
        on disk) and ``TimeoutError`` at ``deadline`` (``time.monotonic()``);
        a caller waiting for another's fsync is bounded by that one's deadline.
        """
        while self._durable < target:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the WAL's fsync did not finish in time")
            if self._running is not None:
                await self._running.wait()
                continue
            self._running = done = anyio.Event()
            covered = self._asked
            try:
                with anyio.fail_after(left):
                    await self._sync()
                self._durable = max(self._durable, covered)
            finally:
                self._running = None
                done.set()

    async def _sync(self) -> None:
        """Have the helper fsync the WAL; raise ``OSError`` if it could not.

        Answers come in the order asked: those of syncs abandoned at their
        deadline (``_owed``) are read first and dropped.
        """
        os.write(self._ask, b"s")
        self._owed += 1
        answers = b""
        while self._owed:
            await anyio.wait_readable(self._told)
            try:
                answers = os.read(self._told, self._owed)
            except BlockingIOError:
                continue
            if not answers:
                raise OSError("the store's fsync helper exited")
            self._owed -= len(answers)
        self.syncs += 1
        if answers[-1:] != b"k":
            raise OSError("fsync of the store's WAL failed")

    def close(self) -> None:
        """Stop the helper (from a worker thread: it waits for the helper to exit)."""
        assert self._helper.stdin is not None
        assert self._helper.stdout is not None
        self._helper.stdin.close()
        try:
            self._helper.wait(timeout=5)
        except subprocess.TimeoutExpired:  # stuck in an fsync: do not leave it behind
            self._helper.kill()
            self._helper.wait()
        self._helper.stdout.close()


def locked(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` says another connection holds a lock this one needs (``SQLITE_BUSY``)."""
    return getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_BUSY


def connect(path: str, call_timeout: float) -> tuple[sqlite3.Connection, bool]:
    """Open ``path`` for use from any thread, in autocommit mode; return it and whether WAL.

    In WAL mode commits do not fsync (``synchronous=NORMAL``) and the
    connection never checkpoints: :class:`WalSync` does both off the loop.
    Any other journal (a ``:memory:`` database, a file SQLite refused WAL
    for) keeps ``synchronous=FULL``. Raises :class:`ConfigError` when the
    file's directory does not exist.
    """
    folder = os.path.dirname(os.path.abspath(path))
    if path != ":memory:" and not os.path.isdir(folder):
        raise ConfigError(f"cannot open sqlite:///{path}: directory {folder} does not exist")
    conn = sqlite3.connect(
        path, timeout=call_timeout, isolation_level=None, check_same_thread=False
    )
    try:
        wal = path != ":memory:" and _enable_wal(conn, deadline=time.monotonic() + call_timeout)
        if wal:
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA wal_autocheckpoint = 0")
        else:
            conn.execute("PRAGMA synchronous = FULL")
    except BaseException:
        conn.close()
        raise
    return conn, wal


def _enable_wal(conn: sqlite3.Connection, *, deadline: float) -> bool:
    """Switch the file to WAL, retrying while other first openers hold the lock; say if it is.

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
        return False
    return True


@contextlib.contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE``; roll back on any error (``ROLLBACK`` errors are secondary)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


def migrate(
    conn: sqlite3.Connection, migrations: Sequence[Migration], where: str, oldest_beside: int = 0
) -> int:
    """Apply missing migrations inside ``BEGIN IMMEDIATE``; return the schema version.

    A schema above this code's that needs newer pods, or one from 1 to below
    ``oldest_beside``, raises :class:`ConfigError`.
    """
    with immediate(conn):
        conn.execute(_VERSION_TABLE)
        applied = int(
            conn.execute(
                "SELECT coalesce(max(version), 0) FROM leaseworker_schema_version"
            ).fetchone()[0]
        )
        refuse_older(where, applied, oldest_beside)
        latest = max(m.version for m in migrations)
        if applied > latest:
            marks = conn.execute(MARKS_ABOVE.format("?"), (latest, latest)).fetchone()
            refuse_newer(where, latest, marks)
        for migration in pending(applied, migrations):
            for statement in migration.sqlite:
                conn.execute(statement)
            conn.execute(
                "INSERT INTO leaseworker_schema_version (version, description, applied_at)"
                " VALUES (?, ?, ?)",
                (migration.version, migration.description, time.time_ns() // 1000),
            )
            if (marked := mark(migration)) is not None:
                conn.execute(MARK.format("?"), marked)
            logger.info(
                "completion store: applied schema version %d (%s)",
                migration.version,
                migration.description,
            )
        conn.execute("COMMIT")
    return max([applied, *(m.version for m in migrations)])
