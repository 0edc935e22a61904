"""What every statement of the PostgreSQL store goes through: its pool, one deadline, its errors.

:class:`PgPool` is the narrow interface the store's parts share (the
batches of :mod:`._pg_store`, the jobs' transactions of :mod:`._pg_effects`,
the relays' claims of :mod:`._pg_claims`): a call runs on a pooled
connection under one deadline, and psycopg's failures become
:class:`StoreUnavailable` with a one-line reason. Also here: how the pool
sets up each new session, and how a completions row reads as a
:class:`Completion`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC
from typing import TypeVar, final

import anyio
import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from ..._errors import StoreUnavailable
from .._fencing import Completion

logger = logging.getLogger("leaseworker.store")

_T = TypeVar("_T")
Conn = psycopg.AsyncConnection[TupleRow]


@final
class PgPool:
    """A store's pooled connections, ``call_timeout`` the bound of every call on them.

    ``shown_url`` is the URL without its password, for error messages.
    """

    def __init__(
        self, pool: AsyncConnectionPool[Conn], *, shown_url: str, call_timeout: float
    ) -> None:
        self.pool = pool
        self.shown_url = shown_url
        self.timeout = call_timeout

    async def run(
        self,
        key: str | None,
        op: Callable[[Conn, Attempt], Awaitable[_T]],
        *,
        within: float | None = None,
    ) -> _T:
        """Run ``op`` on a pooled connection under one deadline; translate failures.

        The deadline is ``within`` seconds from now (default: the store's bound).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.timeout if within is None else within)
        retry = False
        while True:
            attempt = Attempt(retry=retry)
            try:
                async with self.pool.connection(timeout=max(deadline - loop.time(), 0.001)) as conn:
                    timer = loop.call_at(deadline, attempt.sever, conn)
                    try:
                        return await op(conn, attempt)
                    except psycopg.OperationalError:
                        attempt.dead = conn.broken or conn.closed
                        raise
                    finally:
                        timer.cancel()
            except (PoolTimeout, PoolClosed) as exc:
                raise StoreUnavailable(key, self.describe(exc, attempt)) from exc
            except psycopg.OperationalError as exc:
                if attempt.expired or not attempt.dead:  # a live connection's error stands
                    raise StoreUnavailable(key, self.describe(exc, attempt)) from exc
                if loop.time() >= deadline:
                    raise StoreUnavailable(key, self.describe(exc, attempt)) from exc
                logger.info(
                    "completion store: pooled connection was dead (%s); retrying on another",
                    type(exc).__name__,
                )
                retry = True
            except psycopg.Error as exc:
                raise StoreUnavailable(key, self.describe(exc, attempt)) from exc

    def describe(self, exc: psycopg.Error, attempt: Attempt) -> str:
        """Say in one line why ``attempt`` failed with ``exc`` (no row values)."""
        if attempt.expired:
            return f"no answer within {self.timeout}s"
        if isinstance(exc, PoolTimeout):
            return f"no connection to {self.shown_url} within {self.timeout}s"
        if isinstance(exc, PoolClosed):
            return "the store is closed"
        # First line only: later lines (DETAIL, CONTEXT) may quote row values.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        state = f" [{exc.sqlstate}]" if exc.sqlstate else ""
        return f"{type(exc).__name__}{state}: {first}"

    def detail(self, exc: BaseException) -> str:
        """Say in one line why a call outside :meth:`run` failed (a timeout, psycopg, the pool)."""
        if isinstance(exc, TimeoutError):
            return f"no answer within {self.timeout}s"
        if isinstance(exc, PoolTimeout | PoolClosed | psycopg.Error):
            return self.describe(exc, Attempt())
        return type(exc).__name__


async def rollback(conn: Conn) -> None:
    """Roll back whatever was not committed (shielded; a broken connection is the pool's)."""
    with anyio.CancelScope(shield=True), contextlib.suppress(psycopg.Error):
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            await conn.execute("ROLLBACK")


@dataclass(slots=True)
class Attempt:
    """What one try of a call got to: decides whether retrying is safe."""

    retry: bool = False  # an earlier try of the same call failed on a dead connection
    dead: bool = False  # the pooled connection turned out to be broken
    expired: bool = False

    def sever(self, conn: Conn) -> None:
        """Deadline passed: shut the socket down so the pending read fails at once.

        ``shutdown`` on a duplicate descriptor affects the shared socket but
        leaves psycopg's own descriptor open, so its number cannot be reused
        under it before psycopg notices and closes the connection.
        """
        self.expired = True
        try:
            fd = conn.pgconn.socket
            with socket.socket(fileno=os.dup(fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        except (OSError, psycopg.Error):
            pass  # already closed: the pending call fails anyway


@final
class SessionSetup:
    """Pool ``configure`` hook, once per new connection.

    READ COMMITTED is set explicitly because the race-freedom argument (see
    docs/design.md#the-postgresql-store) relies on a fresh snapshot per
    statement (a server, database or URL
    default of REPEATABLE READ would turn lock waits into serialisation
    failures). Set twice: psycopg's setting for the transactions it begins
    (``conn.transaction()``), and the session's default for the single
    statements an autocommit connection runs, which psycopg's setting does not
    reach. The server-side timeouts equal the store's bound. From PostgreSQL
    14 on, a statement whose client went away (a pod killed, a socket shut
    down) ends within :data:`CHECK_CLIENT` (``client_connection_check_interval``),
    not when it next sends a row.
    """

    def __init__(self, call_timeout: float) -> None:
        self._ms = f"{max(1, math.ceil(call_timeout * 1000))}ms"

    async def __call__(self, conn: Conn) -> None:
        await conn.set_isolation_level(psycopg.IsolationLevel.READ_COMMITTED)
        check = conn.info.server_version >= 140000
        await conn.execute(
            "SELECT set_config('default_transaction_isolation', 'read committed', false),"
            " set_config('statement_timeout', %s, false),"
            " set_config('idle_in_transaction_session_timeout', %s, false)"
            + (", set_config('client_connection_check_interval', %s, false)" if check else ""),
            (self._ms, self._ms, CHECK_CLIENT) if check else (self._ms, self._ms),
        )


CHECK_CLIENT = "1s"
"""How often (PostgreSQL 14+) a session's running statement checks that its client is there."""


def maybe_completion_of(job_key: str, row: TupleRow) -> Completion | None:
    """Return the completion in ``row``, or ``None`` where an outer join found none."""
    return None if row[-1] is None else completion_of(job_key, row)


def completion_of(job_key: str, row: TupleRow) -> Completion:
    """Return the completion a ``leaseworker_completions`` row (from its input version) holds.

    The row may end with the cost columns (``state()`` reads them).
    """
    input_version, fence, result, execution_id, pod, completed_at, *cost = row
    cpu, peak = cost or (None, None)
    return Completion(
        job_key=job_key,
        input_version=input_version,
        fence=fence,
        result=result,
        execution_id=execution_id,
        pod=pod,
        completed_at=completed_at.astimezone(UTC),  # the session's TimeZone may be anything
        cpu_seconds=cpu,
        peak_memory=peak,
    )
