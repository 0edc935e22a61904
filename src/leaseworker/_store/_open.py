"""``open_store(url)``: pick the backend by URL, open it, close it afterwards."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator
from pathlib import Path

from .._errors import ConfigError
from .._secrets import SecretFile
from .._version import runs_beside_schema
from ._memory import MemoryStore
from ._protocol import CompletionStore
from ._sqlite import SqliteStore
from ._url import parse_store_url

logger = logging.getLogger("leaseworker.store")

STORE_CONNECTIONS = 10
"""A PostgreSQL store's pooled connections unless ``open_store`` is told otherwise (a pod's)."""


@contextlib.asynccontextmanager
async def open_store(
    url: str | None = None,
    *,
    call_timeout: float = 5.0,
    max_connections: int = STORE_CONNECTIONS,
    relay_connections: int | None = None,
    url_file: str | Path | None = None,
) -> AsyncIterator[CompletionStore]:
    """Open the completion store at ``url`` for the ``async with`` block.

    ::

        async with open_store("postgresql://lw:secret@db:5432/reports") as store:
            if await store.lookup(job_key, version) is None:
                ...  # run the job under its lease, then:
                outcome = await store.complete(CompletionRequest(
                    job_key=job_key, input_version=version, fence=fence,
                    result=row, execution_id=eid, pod=pod))

    ``postgresql://...`` (psycopg 3 with a pool of up to ``max_connections``,
    of which the outbox relay holds ``relay_connections`` at most: by default
    two fifths) for production; ``sqlite:///path`` for the embedded store, which is also
    the default when ``url`` is ``None``; ``sqlite:///:memory:`` or
    ``memory://`` (no database at all; not durable, not shared between pods)
    for tests and demos.
    The schema is created or migrated before the block starts. Every call is
    bounded by ``call_timeout`` seconds. A malformed URL or setting raises
    :class:`ConfigError` before any I/O; a database that cannot be reached
    raises :class:`StoreUnavailable` within about ``call_timeout``; one that
    refuses the connection (credentials, TLS) or whose schema this role may not
    create raises :class:`ConfigError`. ``url_file``: a file holding the URL
    (which then wins over ``url``), read again for every new PostgreSQL
    connection, so a rotated password is used without reopening the store.
    """
    async with opened(
        url,
        call_timeout=call_timeout,
        max_connections=max_connections,
        relay_connections=relay_connections,
        url_file=url_file,
        oldest_beside=runs_beside_schema(),
    ) as store:
        yield store


@contextlib.asynccontextmanager
async def opened(
    url: str | None,
    *,
    call_timeout: float,
    max_connections: int,
    url_file: str | Path | None,
    oldest_beside: int,
    relay_connections: int | None = None,
) -> AsyncIterator[CompletionStore]:
    """:func:`open_store` with the schema floor given: ``leaseworker store migrate`` passes 0.

    A schema from 1 to below ``oldest_beside`` was left by a release this code
    cannot run beside; a pod refuses it (:func:`._schema.refuse_older`).
    """
    source = None if url_file is None else SecretFile(Path(url_file), "store_url_file")
    if source is not None:
        url = source.read()
    parsed = parse_store_url(url)
    if not (isinstance(call_timeout, int | float) and math.isfinite(call_timeout)):
        raise ConfigError(f"call_timeout must be a finite number, got {call_timeout!r}")
    if call_timeout <= 0:
        raise ConfigError(f"call_timeout must be positive, got {call_timeout}")
    if max_connections < 1:
        raise ConfigError(f"max_connections must be at least 1, got {max_connections}")
    if relay_connections is not None and not 1 <= relay_connections <= max_connections:
        raise ConfigError(
            f"relay_connections must be between 1 and max_connections ({max_connections}),"
            f" got {relay_connections}"
        )
    store: CompletionStore
    if parsed.backend == "postgresql":
        # Lazy: psycopg is an optional dependency, loaded only when a postgresql://
        # URL is opened (or migrated: _migrate); tests/test_lazy_imports.py checks it.
        from ._postgres import PostgresStore

        store = await PostgresStore.open(
            parsed,
            call_timeout=call_timeout,
            max_connections=max_connections,
            relay_connections=relay_connections,
            source=source,
            oldest_beside=oldest_beside,
        )
    elif parsed.backend == "memory":
        logger.warning(
            "completion store memory:// keeps completions in this process only: "
            "they are lost at exit and not seen by other pods",
            extra={"event": "store_not_durable"},
        )
        store = MemoryStore()
    else:
        store = await SqliteStore.open(
            parsed, call_timeout=call_timeout, oldest_beside=oldest_beside
        )
    try:
        yield store
    finally:
        await store.aclose()
