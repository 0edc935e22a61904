"""Secured peers, each started once per session: a test CA, PostgreSQL on TLS, Redis on TLS.

- ``test_ca``: the run's certificate authority (``_dev/_services/_tls.py``).
- ``secure_postgres``: ``ssl = on`` and SCRAM passwords over ``hostssl`` only; an
  owner role that migrated the store's database (``store migrate --grant-to``)
  and the runtime role the pods use, which may read and write but not create.
- ``redis_tls``: one TLS-only node asking for client certificates, with the
  ACL user of docs/operations.md.
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
import redis

from leaseworker._dev._services import LocalPostgres, LocalRedis
from leaseworker._dev._services._tls import ServiceTLS, TestCA
from leaseworker._store._grants import migrate_store

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
OWNER, RUNTIME = "lw_owner", "lw_runtime"
STORE_DB = "store"


@pytest.fixture(scope="session")
def test_ca() -> Iterator[TestCA]:
    """The run's test CA, its files in a directory of their own (removed after the session)."""
    directory = Path(tempfile.mkdtemp(prefix="leaseworker-ca-"))
    directory.chmod(0o755)  # PostgreSQL's OS user reads nothing here: it gets copies
    yield TestCA(directory / "ca")
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def other_ca(test_ca: TestCA) -> TestCA:
    """A second CA: "an unknown CA" to every peer of ``test_ca``."""
    return TestCA(test_ca.directory.parent / "other-ca")


@dataclass(frozen=True)
class SecurePostgres:
    """The TLS PostgreSQL, its roles' passwords and the store database's URLs."""

    server: LocalPostgres
    passwords: dict[str, str]

    def url(self, role: str = RUNTIME, *, database: str = STORE_DB, **params: str) -> str:
        """Return ``role``'s verify-full URL of ``database`` (libpq ``params`` override)."""
        password = self.passwords.get(role, "no-such-password")
        return self.server.url_for(database, role=role, password=password, **params)

    def add_role(self, role: str) -> str:
        """Create a login role with a new password; return the password."""
        password = uuid.uuid4().hex
        self.server.create_role(role, password=password)
        self.passwords[role] = password
        return password


@pytest.fixture(scope="session")
def secure_postgres(test_ca: TestCA) -> Iterator[SecurePostgres]:
    """PostgreSQL on TLS with SCRAM; the schema migrated by the owner, granted to the pods."""
    server = LocalPostgres.start(tls=test_ca.server())
    try:
        pg = SecurePostgres(server, {})
        pg.add_role(OWNER)
        pg.add_role(RUNTIME)
        server.execute(f"CREATE DATABASE {STORE_DB} OWNER {OWNER}".encode())
        anyio.run(lambda: migrate_store(pg.url(OWNER), grant_to=[RUNTIME]))
        yield pg
    finally:
        server.stop()


def documented_acl(user: str, password: str) -> list[str]:
    """The ``ACL SETUSER`` line of docs/operations.md, for ``user`` with ``password``."""
    [line] = [
        line.strip()
        for line in DOCS.read_text().splitlines()
        if line.strip().startswith("ACL SETUSER ")
    ]
    argv = shlex.split(line)
    argv[2] = user
    return [f">{password}" if arg == ">CHANGE-ME" else arg for arg in argv]


@dataclass(frozen=True)
class SecureRedis:
    """A TLS Redis, the documented ACL user's name and password, and its client files."""

    server: LocalRedis
    tls: ServiceTLS
    user: str
    password: str

    def url(self, *, user: str | None = None, password: str | None = None) -> str:
        """Return a ``rediss://`` URL as the ACL user (or another), with CA and client cert."""
        name, secret = user or self.user, self.password if password is None else password
        return self.server.url.replace("rediss://", f"rediss://{name}:{secret}@", 1)


@pytest.fixture(scope="session")
def redis_tls(test_ca: TestCA) -> Iterator[SecureRedis]:
    """One TLS-only Redis asking for client certificates, with the documented ACL user."""
    tls = ServiceTLS(server=test_ca.server(), client=test_ca.client("leaseworker"))
    server = LocalRedis.start(tls=tls)
    try:
        user, password = "leaseworker", uuid.uuid4().hex
        with admin_client(server, tls) as admin:
            admin.execute_command(*documented_acl(user, password))
        yield SecureRedis(server, tls, user, password)
    finally:
        server.stop()


def admin_client(server: LocalRedis, tls: ServiceTLS) -> redis.Redis:
    """A synchronous client of the default (admin) user, over TLS; close it after use."""
    return redis.Redis(host="127.0.0.1", port=server.port, **tls.redis_kwargs())  # type: ignore[arg-type]
