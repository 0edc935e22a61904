"""The fence guard, for jobs that write effects outside the completion store.

:func:`fenced_upsert` builds one upsert that only replaces a row whose stored
fence is not newer than the writer's (1 row written, 0 stale); the job must
claim its fence first to refuse a former holder before its first write.
See docs/design.md#fence-guard and docs/completion.md#effects-outside-the-store.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PLACEHOLDER = {"pyformat": "%({})s", "named": ":{}"}


def fenced_upsert(
    table: str,
    *,
    key: Sequence[str],
    columns: Sequence[str],
    fence_column: str = "fence",
    paramstyle: Literal["pyformat", "named"] = "pyformat",
) -> str:
    """Return an upsert into ``table`` that never replaces a row with a newer fence.

    ``key`` names the conflict target (a primary key or unique constraint),
    ``columns`` the other columns written; every name becomes a parameter of
    the same name, plus ``fence_column``. ``paramstyle`` is ``"pyformat"``
    (``%(name)s``: psycopg) or ``"named"`` (``:name``: sqlite3). Names must be
    plain identifiers (``schema.table`` allowed for the table); they are
    double-quoted, so pass them as stored (lower case for unquoted PostgreSQL
    names). Example, with psycopg::

        sql = fenced_upsert("report", key=["tenant", "period"], columns=["total"])
        cur = await conn.execute(sql, {"tenant": t, "period": p, "total": 42, "fence": fence})
        if cur.rowcount == 0:
            ...  # a newer fence already wrote this row: this execution is stale

    Run it in the transaction that first checks the job key's claimed fence
    (``SELECT ... FOR UPDATE`` on the row your claim raised) and refuses when
    it is above this execution's fence.
    """
    keys, values = list(key), list(columns)
    if not keys:
        raise ValueError("key must name at least one column")
    names = [*keys, *values, fence_column]
    if len(set(names)) != len(names):
        raise ValueError(f"column names must be distinct: {names}")
    target = ".".join(_quoted(part) for part in table.split("."))
    placeholder = _PLACEHOLDER[paramstyle]
    updates = [*values, fence_column]
    fence = _quoted(fence_column)
    return (
        f"INSERT INTO {target} AS cur ({', '.join(_quoted(n) for n in names)})\n"
        f"VALUES ({', '.join(placeholder.format(n) for n in names)})\n"
        f"ON CONFLICT ({', '.join(_quoted(k) for k in keys)}) DO UPDATE\n"
        f"SET {', '.join(f'{_quoted(c)} = EXCLUDED.{_quoted(c)}' for c in updates)}\n"
        f"WHERE cur.{fence} <= EXCLUDED.{fence}"
    )


def _quoted(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(f"not a plain SQL identifier: {name!r}")
    return f'"{name}"'
