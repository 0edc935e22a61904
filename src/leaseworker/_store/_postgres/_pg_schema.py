"""Opening the PostgreSQL store: the first connection, the schema's version, the migrations.

The first connection tells a refusal (exit 2) from a server that is not up
(wait), see :mod:`._pg_refusal`. A schema that is current is only read, so a
runtime role without DDL rights can open the store; one that is behind is
migrated under an advisory lock when the role may, and otherwise the error
says how (``leaseworker store migrate``, :mod:`._pg_grants`).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from typing import Any

import anyio
import psycopg

from ..._errors import ConfigError, StoreUnavailable
from ..._secrets import SecretFile
from .._migration import Migration
from .._schema import (
    ADVISORY_LOCK_KEY,
    MARK,
    MARKS_ABOVE,
    VERSION_TABLE,
    mark,
    pending,
    refuse_newer,
    refuse_older,
)
from .._url import StoreURL, parse_store_url
from ._pg_grants import MIGRATE_HINT, check_privileges
from ._pg_pool import Conn
from ._pg_refusal import refusal
from ._pg_standby import standbys, warning

logger = logging.getLogger("leaseworker.store")

_VERSION_TABLE = """
    CREATE TABLE IF NOT EXISTS leaseworker_schema_version (
        version     integer PRIMARY KEY,
        description text NOT NULL,
        applied_at  timestamptz NOT NULL DEFAULT now()
    )
"""


def reread_url(source: SecretFile, opened: StoreURL) -> str:
    """Return the URL in ``source`` now, for a new pooled connection (a rotated password).

    A file that cannot be read, or holds no PostgreSQL URL, gives the URL the
    store was opened with: its connection then fails or succeeds as before.
    """
    try:
        current = parse_store_url(source.read())
    except ConfigError as exc:
        logger.warning("completion store: %s; connecting with the URL read at start", exc)
        return opened.target
    return current.target if current.backend == "postgresql" else opened.target


async def first_connection(url: StoreURL, call_timeout: float) -> None:
    """Connect once before the pool does, to tell a refusal from a server not up yet.

    The pool retries failed connections in the background and reports only a
    timeout; this attempt's error says what happened (:mod:`._pg_refusal`).
    """
    try:
        conn = await psycopg.AsyncConnection.connect(
            url.target, autocommit=True, connect_timeout=max(2, math.ceil(call_timeout))
        )
    except psycopg.OperationalError as exc:
        refused = await anyio.to_thread.run_sync(
            functools.partial(refusal, url, exc, timeout=call_timeout)
        )
        if refused is not None:
            raise refused from None
        raise StoreUnavailable(
            None, f"cannot connect to {url.redacted} ({type(exc).__name__})"
        ) from exc
    await conn.close()


async def check_at(url: StoreURL, call_timeout: float, latest: int) -> dict[str, Any]:
    """Report the store at ``url`` for ``store check``, changing nothing.

    The schema's version (``latest``: this release's), the standbys streaming
    from the server, and a warning when commits do not wait for them. A
    refusal raises :class:`ConfigError`, a server not answering StoreUnavailable.
    """
    await first_connection(url, call_timeout)
    where = f"completion store at {url.redacted}"
    try:
        with anyio.fail_after(2 * call_timeout):
            conn = await psycopg.AsyncConnection.connect(
                url.target, autocommit=True, connect_timeout=max(2, math.ceil(call_timeout))
            )
            async with conn:
                version = await _applied_version(conn, where)
                count, reason = await standbys(conn)
    except (psycopg.Error, TimeoutError) as exc:
        raise StoreUnavailable(None, f"cannot check {url.redacted} ({type(exc).__name__})") from exc
    return {
        "schema_version": version,
        "latest_schema_version": latest,
        "standbys": count,
        "warnings": [] if reason is None else [warning(where, count, reason)],
    }


async def _applied_version(conn: Conn, where: str) -> int:
    """Return the schema version the database records (0: no schema), without any DDL."""
    exists = await (
        await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (VERSION_TABLE,))
    ).fetchone()
    if exists is None or not exists[0]:
        return 0
    readable = await (
        await conn.execute("SELECT has_table_privilege(%s, 'SELECT')", (VERSION_TABLE,))
    ).fetchone()
    if readable is None or not readable[0]:
        raise ConfigError(f"{where}: the role lacks SELECT on {VERSION_TABLE}")
    row = await (
        await conn.execute(f"SELECT coalesce(max(version), 0) FROM {VERSION_TABLE}")
    ).fetchone()
    return int(row[0]) if row is not None else 0


async def migrate(
    conn: Conn, migrations: Sequence[Migration], where: str, oldest_beside: int = 0
) -> int:
    """Bring the schema to the latest version if it is behind; return the version.

    A current schema is only read (a runtime role without DDL rights starts),
    then the role's table privileges are checked; a schema that is behind is
    migrated if the role may, else :class:`ConfigError` says how to migrate it.
    One of a release this code cannot run beside (below ``oldest_beside``), or
    newer than it runs beside, raises :class:`ConfigError`.
    """
    latest = max(m.version for m in migrations)
    applied = await _applied_version(conn, where)
    refuse_older(where, applied, oldest_beside)
    if applied > latest:
        marks = await conn.execute(MARKS_ABOVE.format("%s"), (latest, latest))
        refuse_newer(where, latest, await marks.fetchone())
    if applied < latest:
        try:
            applied = await _apply(conn, migrations)
        except psycopg.errors.InsufficientPrivilege:
            raise ConfigError(
                f"{where}: the schema is at version {applied} of {latest} and this role may "
                f"not migrate it; {MIGRATE_HINT}"
            ) from None
    await check_privileges(conn, where)
    return max(applied, latest)


async def _apply(conn: Conn, migrations: Sequence[Migration]) -> int:
    """Apply missing migrations under a transaction-scoped advisory lock; return the version."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK_KEY,))
        await conn.execute(_VERSION_TABLE)
        row = await (
            await conn.execute("SELECT coalesce(max(version), 0) FROM leaseworker_schema_version")
        ).fetchone()
        applied = int(row[0]) if row is not None else 0
        for migration in pending(applied, migrations):
            for statement in migration.postgresql:
                await conn.execute(statement)
            await conn.execute(
                "INSERT INTO leaseworker_schema_version (version, description) VALUES (%s, %s)",
                (migration.version, migration.description),
            )
            if (marked := mark(migration)) is not None:
                await conn.execute(MARK.format("%s"), marked)
            logger.info(
                "completion store: applied schema version %d (%s)",
                migration.version,
                migration.description,
            )
    return max([applied, *(m.version for m in migrations)])
