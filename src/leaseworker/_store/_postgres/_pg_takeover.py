"""A takeover ends the session of the execution it took the job key from.

A job's transaction marks its backend with the job key and its fence
(:func:`marker`: ``application_name``, which ``pg_stat_activity`` shows to
every role; set with ``SET LOCAL``, so it ends with the transaction). A
session that waits for a key's head row longer than :data:`LOOK_AFTER`
(a batch's claims and completions, a job's transaction opening) is looked
at from a second pooled connection: the blockers ``pg_blocking_pids``
names that are marked with one of its keys and a lower fence are ended
(``pg_terminate_backend``). The waiter holds the higher fence, so the
lease of the lower one ended before it was acquired: that execution can
commit nothing of worth, and only a paused or stuck pod still holds the
row (a live one ends its own statement when its lease is lost). A
blocker this role may not end is waited for, as before, with one log
line. The look repeats while the wait lasts: the next holder in line
may be another old execution.

A blocker that is committing is never ended: ended while its commit waits
for a synchronous standby, PostgreSQL ends the wait, not the transaction,
which is then seen by every session though the standby may lack it (a
promotion would lose what the taker saw). The statement that ends a
session checks, from the same read of ``pg_stat_activity``, that it still
carries the mark, is not running ``COMMIT`` nor waiting in ``SyncRep``,
and that this role sees its state (``NULL`` otherwise: then it is waited
for). What is left: a session that sends its ``COMMIT`` after that read
and before the signal (one statement's time) is ended in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Iterator, Mapping

import psycopg
from psycopg_pool import PoolClosed, PoolTimeout

from ._pg_pool import Conn, PgPool

logger = logging.getLogger("leaseworker.store")

LOOK_AFTER = 0.2
"""Seconds a session waits for a head row before its blockers are looked at (and again)."""

_PREFIX = "lw:"
# Who blocks the waiter, with their marks: readable by any role (application_name).
_BLOCKERS = """
    SELECT pid, application_name FROM pg_stat_activity
    WHERE pid = ANY (pg_blocking_pids(%s)) AND starts_with(application_name, %s)
"""
# End the session if it still carries the mark and is not committing (a job's
# transaction commits with a statement of its own); say why not otherwise. A
# role that may not see its state reads NULLs: its commit could not be told.
_END = """
    SELECT CASE
        WHEN state IS NULL THEN 'hidden'
        WHEN wait_event IS NOT DISTINCT FROM 'SyncRep' OR (state = 'active' AND query = 'COMMIT')
            THEN 'committing'
        WHEN pg_terminate_backend(pid) THEN 'ended'
        ELSE 'gone' END
    FROM pg_stat_activity WHERE pid = %s AND application_name = %s
"""


def tag(job_key: str) -> str:
    """Return the marker's name for ``job_key``: 32 hex digits (a name has 63 bytes at most)."""
    return hashlib.blake2b(job_key.encode(), digest_size=16).hexdigest()


def marker(job_key: str, fence: int) -> str:
    """Return the ``application_name`` a transaction of ``job_key`` at ``fence`` carries."""
    return f"{_PREFIX}{tag(job_key)}:{fence}"


def _marked(name: str) -> tuple[str, int] | None:
    """Return the tag and fence of a marker, ``None`` for another name."""
    _, _, rest = name.partition(_PREFIX)
    key_tag, _, fence = rest.partition(":")
    return (key_tag, int(fence)) if fence.isdigit() else None


@contextlib.contextmanager
def ending_older_holders(pool: PgPool, conn: Conn, fences: Mapping[str, int]) -> Iterator[None]:
    """While the block waits on ``conn``, end sessions of ``fences``' keys at lower fences.

    ``fences``: the highest fence of each job key the waiting statement
    locks the head row of. Costs one timer unless the statement waits.
    """
    if not fences:
        yield
        return
    loop = asyncio.get_running_loop()
    waited = asyncio.Event()
    waiter = conn.info.backend_pid

    def start() -> None:  # only now the keys' tags: most waits are short
        wanted = {tag(key): fence for key, fence in fences.items()}
        look = loop.create_task(_look(pool, waiter, wanted, waited))
        _LOOKS.add(look)
        look.add_done_callback(_LOOKS.discard)

    timer = loop.call_later(LOOK_AFTER, start)
    try:
        yield
    finally:
        timer.cancel()
        waited.set()  # a look ends after its statement: not cancelled in the middle of one


_LOOKS: set[asyncio.Task[None]] = set()
"""The looks running (the loop keeps only weak references to its tasks)."""


async def _look(
    pool: PgPool, waiter: int, wanted: Mapping[str, int], waited: asyncio.Event
) -> None:
    """Every LOOK_AFTER until ``waited``: end ``waiter``'s blockers marked with a lower fence."""
    told: set[int] = set()
    try:
        async with pool.pool.connection(timeout=pool.timeout) as conn:
            while not waited.is_set():
                rows = await (await conn.execute(_BLOCKERS, (waiter, _PREFIX))).fetchall()
                for pid, name in rows:
                    marked = _marked(name)
                    if marked is not None and marked[1] < wanted.get(marked[0], -1):
                        await _end(conn, pid, name, marked[1], told)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waited.wait(), LOOK_AFTER)
    except (psycopg.Error, PoolTimeout, PoolClosed) as exc:
        logger.warning(
            "completion store: could not look at what holds a job key's head row (%s);"
            " waiting for it",
            type(exc).__name__,
        )


async def _end(conn: Conn, pid: int, name: str, fence: int, told: set[int]) -> None:
    """End backend ``pid`` (an older execution's, at ``fence``) unless it is committing.

    Logs once per backend when it is left to run: committing (its wait for a
    synchronous standby), or this role may not see or end it.
    """
    try:
        row = await (await conn.execute(_END, (pid, name))).fetchone()
    except psycopg.errors.InsufficientPrivilege:
        row = ("forbidden",)
    outcome = "gone" if row is None else row[0]
    if outcome == "ended":
        logger.info(
            "completion store: ended the session of an older execution (fence %d) that held"
            " a job key's head row",
            fence,
        )
    elif outcome != "gone" and pid not in told:
        told.add(pid)
        why = {
            "committing": "is committing (ended, a wait for a standby would commit it)",
            "hidden": "this role may not see whether it is committing",
            "forbidden": "this role may not end it",
        }[outcome]
        logger.warning(
            "completion store: the session of an older execution (fence %d) holds a job"
            " key's head row and %s; waiting for it",
            fence,
            why,
        )
