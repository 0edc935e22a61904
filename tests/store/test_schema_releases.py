"""Pods of two releases on one store: the schema's marks say who may start beside it.

From migration 13 each version row names the release that applied it and the
schema of the oldest release it runs beside. A pod whose schema is older than
that refuses to start with one line naming both releases (``leaseworker run``
exits 2); a newer schema whose release runs beside this one's is opened as
before (additive migrations, a rolling upgrade). The other way round, a pod
does not migrate a schema of a release it cannot run beside (its pods may
still be on it): ``leaseworker store migrate`` does, once they are stopped.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from leaseworker import ConfigError, __version__, open_store
from leaseworker._store import MIGRATIONS, SqliteStore, migrate_store, parse_store_url
from leaseworker._store._postgres import PostgresStore
from leaseworker_dev._services import LocalRedis

from ..pods import REPO
from .test_store import raw

LATEST = MIGRATIONS[-1].version
OLDEST_BESIDE = 12  # the schema of 0.1.0, the oldest release this one runs beside


async def _mark_newer(url: str, runs_beside: int) -> None:
    """Record a version above this code's, as a later release would, needing ``runs_beside``."""
    applied_at = "0" if url.startswith("sqlite") else "now()"
    await raw(
        url,
        "INSERT INTO leaseworker_schema_version"
        " (version, description, release, runs_beside, applied_at)"
        f" VALUES (%s, %s, %s, %s, {applied_at})",
        (LATEST + 1, "test: a later release's migration", "9.1.0", runs_beside),
    )


async def test_each_marked_migration_names_this_release_and_the_schema_it_runs_beside(
    store_url: str,
) -> None:
    """Rows before 13 (written by code that had no marks) stay unmarked; from 13 they carry both."""
    async with open_store(store_url):
        pass
    rows = await raw(
        store_url,
        "SELECT version, release, runs_beside FROM leaseworker_schema_version"
        " WHERE version >= 12 ORDER BY version",
    )
    assert rows == [
        (12, None, None),
        *((m.version, __version__, OLDEST_BESIDE) for m in MIGRATIONS if m.version >= 13),
    ]


async def test_a_schema_marked_newer_than_the_pod_runs_beside_is_refused_in_one_line(
    store_url: str,
) -> None:
    """The error names the store's release and version, and this pod's; nothing is migrated."""
    async with open_store(store_url):
        pass
    await _mark_newer(store_url, runs_beside=LATEST + 1)
    message = await _refusal(store_url)
    assert f"schema version {LATEST + 1} was applied by leaseworker 9.1.0" in message
    assert f"this pod's leaseworker {__version__} (schema {LATEST})" in message


async def test_a_newer_schema_that_runs_beside_this_release_opens(store_url: str) -> None:
    """A later release whose migrations are additive for this one: the pod starts on it."""
    async with open_store(store_url):
        pass
    await _mark_newer(store_url, runs_beside=LATEST)
    async with open_store(store_url) as store:
        assert getattr(store, "schema_version", None) == LATEST + 1


async def test_leaseworker_run_exits_2_naming_both_releases(
    redis_server: LocalRedis, tmp_path: Path
) -> None:
    """The pod reaches the store after Redis; it then exits 2 with the one line, not a retry."""
    url = f"sqlite:///{tmp_path / 'shared.sqlite3'}"
    async with open_store(url):
        pass
    await _mark_newer(url, runs_beside=LATEST + 1)
    ended = await anyio.to_thread.run_sync(
        functools.partial(
            subprocess.run,
            [
                *(sys.executable, "-m", "leaseworker._cli", "run", "tests.jobs:MarkerJob"),
                *("--pod", "old-pod", "--redis-url", redis_server.url, "--store-url", url),
                *("--bootstrap-servers", "127.0.0.1:9"),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    )
    assert ended.returncode == 2, ended.stderr
    [error] = [line for line in ended.stderr.splitlines() if ": error: " in line]
    assert "leaseworker 9.1.0, which cannot run beside this pod's leaseworker" in error
    assert __version__ in error


async def test_a_schema_of_a_release_this_one_cannot_run_beside_is_left_to_store_migrate(
    store_url: str,
) -> None:
    """Schema 11 (code before 0.1.0): the pod refuses in one line and changes nothing.

    ``leaseworker store migrate`` then brings it to this release's schema, and
    the pod opens it.
    """
    parsed = parse_store_url(store_url)
    older = MIGRATIONS[: OLDEST_BESIDE - 1]
    if parsed.backend == "postgresql":
        await (await PostgresStore.open(parsed, call_timeout=5.0, migrations=older)).aclose()
    else:
        await (await SqliteStore.open(parsed, call_timeout=5.0, migrations=older)).aclose()
    message = await _refusal(store_url)
    assert f"schema version {OLDEST_BESIDE - 1} is of unreleased code" in message
    assert f"this pod's leaseworker {__version__} cannot run beside" in message
    assert message.endswith("then run leaseworker store migrate")
    versions = await raw(store_url, "SELECT max(version) FROM leaseworker_schema_version")
    assert versions == [(OLDEST_BESIDE - 1,)]
    assert await migrate_store(store_url) == LATEST
    async with open_store(store_url) as store:
        assert getattr(store, "schema_version", None) == LATEST


async def _refusal(store_url: str) -> str:
    """Return the ``ConfigError`` opening the store raises: one line."""
    with pytest.raises(ConfigError) as refused:
        async with open_store(store_url):
            pass
    message = str(refused.value)
    assert "\n" not in message
    return message
