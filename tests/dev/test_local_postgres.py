"""LocalPostgres: a private cluster that really serves queries and stops by PID."""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from leaseworker_dev._services import LocalPostgres, ToolMissingError
from leaseworker_dev._services._local_postgres import find_bindir


@pytest.fixture(scope="module")
def shared_pg() -> Iterator[LocalPostgres]:
    """One cluster for the tests that do not stop it (initdb takes about 2 s)."""
    pg = LocalPostgres.start()
    try:
        yield pg
    finally:
        pg.stop()


async def test_roundtrip_in_transaction_then_stop() -> None:
    """A fresh cluster stores and returns rows in a transaction and exits on stop()."""
    pg = LocalPostgres.start()
    try:
        async with await psycopg.AsyncConnection.connect(pg.url) as conn:
            async with conn.transaction():
                await conn.execute("CREATE TABLE lease (key text PRIMARY KEY, token bigint)")
                await conn.execute(
                    "INSERT INTO lease (key, token) VALUES (%s, %s), (%s, %s)",
                    ("a", 1, "b", 2),
                )
                cur = await conn.execute("SELECT key, token FROM lease ORDER BY key")
                assert await cur.fetchall() == [("a", 1), ("b", 2)]
            cur = await conn.execute("SELECT current_database(), current_setting('fsync')")
            assert await cur.fetchone() == ("leaseworker", "off")
    finally:
        pg.stop()
    assert pg.process.popen.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pg.process.pid, 0)
    assert not pg.workdir.exists()


def test_server_runs_unprivileged(shared_pg: LocalPostgres) -> None:
    """As root the server runs as the postgres system user, otherwise as us."""
    owner = Path(f"/proc/{shared_pg.process.pid}").stat().st_uid
    expected = pwd.getpwnam("postgres").pw_uid if os.geteuid() == 0 else os.geteuid()
    assert owner == expected
    assert owner != 0


def test_tcp_requires_the_password(shared_pg: LocalPostgres) -> None:
    """Loopback TCP without the generated password is refused."""
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(f"postgresql://postgres@127.0.0.1:{shared_pg.port}/leaseworker").close()


async def test_create_database_isolates_tables(shared_pg: LocalPostgres) -> None:
    """create_database() returns a URL of a new, separate database."""
    url = shared_pg.create_database("isolated_one")
    assert url.endswith("/isolated_one")
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("CREATE TABLE only_here (x int)")
    async with await psycopg.AsyncConnection.connect(shared_pg.url) as conn:
        cur = await conn.execute("SELECT to_regclass('only_here') IS NULL")
        assert await cur.fetchone() == (True,)


def test_create_database_rejects_odd_names(shared_pg: LocalPostgres) -> None:
    """Names that would need quoting in SQL or URLs are refused up front."""
    with pytest.raises(ValueError, match="database name"):
        shared_pg.create_database("Bad-Name")


def test_missing_binaries_name_bootstrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without any PostgreSQL install the error tells the user to run bootstrap.sh.

    A ``ToolMissingError``: ``demo services --postgres`` prints it as one line (exit 2).
    """
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToolMissingError, match=r"scripts/bootstrap\.sh"):
        find_bindir(str(tmp_path / "*" / "bin"))


def test_highest_version_wins(tmp_path: Path) -> None:
    """Among several /usr/lib/postgresql/NN/bin the highest major version is picked."""
    for version in ("9.6", "15", "16", "13"):
        bindir = tmp_path / version / "bin"
        bindir.mkdir(parents=True)
        for name in ("initdb", "postgres"):
            (bindir / name).touch(mode=0o755)
    assert find_bindir(str(tmp_path / "*" / "bin")) == tmp_path / "16" / "bin"


def test_a_copy_of_the_kept_cluster_takes_its_own_password_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first start keeps its ``initdb`` (a cache of the test's own); the second copies it.

    The copy comes with the first cluster's superuser password, which the second
    start replaces before anyone logs in: over TCP the first's is refused there.
    """
    monkeypatch.setenv("LEASEWORKER_CACHE", str(tmp_path / "cache"))
    first = LocalPostgres.start()
    try:
        [kept] = (tmp_path / "cache" / "postgres").iterdir()
        assert (kept / "PG_VERSION").is_file()
        second = LocalPostgres.start()
        try:
            with psycopg.connect(second.url_for("postgres")) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
            with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
                psycopg.connect(second.url_for("postgres", password=first.password))
        finally:
            second.stop()
    finally:
        first.stop()
