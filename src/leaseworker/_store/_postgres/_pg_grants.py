"""What the pod's PostgreSQL role needs, checked at start; granted by ``store migrate``.

Least privilege: the pods run as a *runtime* role that reads and writes the
store's tables and changes no schema; an *owner* role creates and migrates
the schema once per release (``leaseworker store migrate --store-url OWNER_URL
--grant-to RUNTIME_ROLE``). The functions the store calls run with the
caller's rights, so table privileges are all the runtime role needs
(``EXECUTE`` on functions is PostgreSQL's default for every role): reading
the version table and the views, ``SELECT, INSERT, UPDATE`` on every other
``leaseworker_*`` table, those a later migration adds included, and
``DELETE`` as well on the outbox's three tables (a relay's mark deletes its
queue rows, the retention deletes sent rows and their rounds).
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import AsyncConnection, sql
from psycopg.rows import TupleRow

from ..._errors import ConfigError
from .._schema import VERSION_TABLE

WRITE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE")
"""What a pod's role needs on every store table (``leaseworker_*``) but the version table."""

VERSION_PRIVILEGES = ("SELECT",)
"""What it needs on the version table (``_schema.VERSION_TABLE``) and the views: reading them."""

DELETE_TABLES = frozenset(
    {"leaseworker_outbox", "leaseworker_outbox_unsent", "leaseworker_outbox_sent"}
)
"""The tables whose rows a pod deletes: a mark's queue rows, the retention's sent rows."""

MIGRATE_HINT = "run `leaseworker store migrate --store-url <owner URL>` once as the schema's owner"

_TABLES = r"""
    SELECT c.relname, c.relkind = 'v' FROM pg_class c
    WHERE c.relkind IN ('r', 'p', 'v') AND c.relname LIKE 'leaseworker\_%'
      AND pg_table_is_visible(c.oid)
    ORDER BY c.relname
"""


async def runtime_privileges(conn: AsyncConnection[TupleRow]) -> dict[str, tuple[str, ...]]:
    """Return each store table the session sees with the privileges a pod needs on it."""
    found = await (await conn.execute(_TABLES)).fetchall()
    return {table: _privileges(table, view) for table, view in found}


def _privileges(table: str, view: bool) -> tuple[str, ...]:
    if view or table == VERSION_TABLE:
        return VERSION_PRIVILEGES
    return (*WRITE_PRIVILEGES, "DELETE") if table in DELETE_TABLES else WRITE_PRIVILEGES


async def missing_privileges(conn: AsyncConnection[TupleRow]) -> list[str]:
    """Return ``"UPDATE on leaseworker_jobs"``-style names of what the session's role lacks."""
    wanted = await runtime_privileges(conn)
    names = [(table, privilege) for table, privileges in wanted.items() for privilege in privileges]
    cursor = await conn.execute(
        "SELECT t, p FROM unnest(%s::text[], %s::text[]) AS w(t, p) "
        "WHERE NOT has_table_privilege(t, p)",
        ([t for t, _ in names], [p for _, p in names]),
    )
    return [f"{privilege} on {table}" for table, privilege in await cursor.fetchall()]


async def check_privileges(conn: AsyncConnection[TupleRow], where: str) -> None:
    """Raise :class:`ConfigError` naming every privilege the session's role lacks."""
    missing = await missing_privileges(conn)
    if missing:
        raise ConfigError(
            f"{where}: the role lacks {', '.join(missing)}; grant them, or {MIGRATE_HINT} "
            "with --grant-to <role>"
        )


async def grant_runtime(conn: AsyncConnection[TupleRow], roles: Sequence[str]) -> None:
    """Grant ``roles`` exactly what :func:`runtime_privileges` names, in one transaction."""
    async with conn.transaction():
        for table, privileges in (await runtime_privileges(conn)).items():
            for role in roles:
                statement = sql.SQL("GRANT {} ON {} TO {}").format(
                    sql.SQL(", ").join(sql.SQL(p) for p in privileges),
                    sql.Identifier(table),
                    sql.Identifier(role),
                )
                await conn.execute(statement)


async def grant_runtime_at(target: str, roles: Sequence[str]) -> None:
    """Connect to ``target`` (a libpq URL) and :func:`grant_runtime` ``roles``."""
    async with await AsyncConnection.connect(target, autocommit=True) as conn:
        await grant_runtime(conn, roles)
