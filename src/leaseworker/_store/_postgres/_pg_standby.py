"""Whether the primary waits for its standbys: a warning at open and in ``store check``.

With a standby that commits do not wait for, a failover loses what the
standby had not received: completions, claims and outbox rows the pods were
told are committed, and with them the fences that refused older executions
(a lower fence is accepted again). The server says whether it has standbys
(``pg_stat_replication``, readable by any role) and whether this session's
commits wait for one (``synchronous_standby_names`` and this session's
``synchronous_commit``). A single node says nothing: it has no failover to
lose a commit to, and its durability is its own ``fsync``'s; a warning there
would be on every development server. Replication the server cannot see
(storage-level, a log-shipping standby that does not stream) is not judged.
"""

from __future__ import annotations

import logging

from ._pg_pool import Conn

logger = logging.getLogger("leaseworker.store")

_STATE = """
    SELECT (SELECT count(*) FROM pg_stat_replication),
           current_setting('synchronous_standby_names'),
           current_setting('synchronous_commit')
"""

_NOT_WAITING = ("off", "local")
"""``synchronous_commit`` values a commit does not wait for any standby with."""


async def standbys(conn: Conn) -> tuple[int, str | None]:
    """Return the number of standbys streaming from this server and why commits skip them.

    The reason is ``None`` when commits wait for a standby, or there is none.
    """
    row = await (await conn.execute(_STATE)).fetchone()
    assert row is not None  # one row always
    count, names, commit = int(row[0]), str(row[1]).strip(), str(row[2])
    if count == 0:
        return 0, None
    if not names:
        return count, "synchronous_standby_names is empty"
    if commit in _NOT_WAITING:
        return count, f"synchronous_commit is {commit}"
    return count, None


def warning(where: str, count: int, reason: str) -> str:
    """Say in one line that the primary does not wait for its ``count`` standbys, and why."""
    return (
        f"{where}: the primary does not wait for its {count} standby(s) ({reason}): "
        "a failover loses the commits they had not received, and fences with them"
    )


async def warn_unless_waited_for(conn: Conn, where: str) -> None:
    """Log :func:`warning` once when the server has standbys its commits do not wait for."""
    count, reason = await standbys(conn)
    if reason is not None:
        logger.warning(warning(where, count, reason), extra={"event": "store_standby_async"})
