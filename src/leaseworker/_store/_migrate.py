"""``leaseworker store migrate`` and ``store check``: a schema by URL, its use, its standbys.

Opening a store migrates its schema (each backend applies
:data:`~._schema.MIGRATIONS` in :func:`~._schema.pending` order under its own
lock: :mod:`._postgres._pg_schema`, :mod:`._sqlite._sqlite_sync`); this is
the operator's command for it, run once per release as the schema's owner,
so the pods' runtime role needs no DDL rights.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._errors import ConfigError
from ._open import opened
from ._schema import MIGRATIONS
from ._url import parse_store_url


async def migrate_store(
    url: str, *, grant_to: Sequence[str] = (), call_timeout: float = 5.0
) -> int:
    """Create or migrate the schema at ``url``, grant ``grant_to`` its use; return the version.

    ``leaseworker store migrate`` calls this with the owner role's URL. A
    malformed URL, a refusal or ``grant_to`` on a store that has no roles
    raise :class:`ConfigError`; a database that is not up, StoreUnavailable.
    """
    parsed = parse_store_url(url)
    if grant_to and parsed.backend != "postgresql":
        raise ConfigError(f"--grant-to needs a PostgreSQL store, not {parsed.redacted}")
    # No floor: the operator runs it once the pods of an older release are stopped.
    opening = opened(
        url, call_timeout=call_timeout, max_connections=1, url_file=None, oldest_beside=0
    )
    async with opening as store:
        version = int(getattr(store, "schema_version", 0))
    if grant_to:
        # Lazy, as in open_store: psycopg (an optional dependency) only for a PostgreSQL store.
        from ._postgres import grant_runtime_at

        await grant_runtime_at(parsed.target, grant_to)
    return version


async def check_store(url: str, *, call_timeout: float = 5.0) -> dict[str, Any]:
    """Report the store at ``url`` for ``leaseworker store check``, changing nothing.

    ``backend``; on PostgreSQL also the schema's version, the standbys
    streaming from the server, and ``warnings`` (one line when commits do not
    wait for them). SQLite and ``memory://`` have no standbys: no warning.
    """
    parsed = parse_store_url(url)
    report: dict[str, Any] = {"backend": parsed.backend, "warnings": []}
    if parsed.backend == "postgresql":
        from ._postgres import check_at  # lazy, as in open_store

        latest = max(m.version for m in MIGRATIONS)
        report.update(await check_at(parsed, call_timeout, latest))
    return report
