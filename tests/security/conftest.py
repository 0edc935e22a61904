"""Secured peers, each started once per session, all with certificates of one test CA.

- ``test_ca``: the run's certificate authority (``_dev/_services/_tls.py``);
  ``other_ca`` is the CA no peer trusts.
- ``secured_kafka``: a KRaft broker with SSL and SASL_SSL listeners, SCRAM and
  PLAIN users and the ``StandardAuthorizer`` (``secured_kafka.py``).
- ``otlp_collector``: an OTLP/HTTP collector on HTTPS keeping every export.
- ``stack``: all of them at once for one pod (``stack.py``); ``pods``: killed at the end.
- ``secure_postgres``: ``ssl = on`` and SCRAM passwords over ``hostssl`` only; an
  owner role that migrated the store's database (``store migrate --grant-to``)
  and the runtime role the pods use, which may read and write but not create.
- ``redis_tls``, ``sentinel_tls``, ``cluster_tls``: one node, a Sentinel group
  and a Cluster, TLS only (replication, sentinels and the cluster bus too),
  asking for client certificates, with the ACL user of docs/operations.md on
  every data node.
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest
import redis

from leaseworker._store import migrate_store
from leaseworker_dev._services import (
    LocalPostgres,
    LocalRedis,
    LocalRedisCluster,
    LocalSentinelGroup,
    PodProcess,
    RedisNode,
    ServiceTLS,
    TestCA,
)

from .collector import Collector, https_collector
from .secured_kafka import SecuredKafka, start_secured_kafka

if TYPE_CHECKING:
    from .stack import SecuredStack

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


@pytest.fixture(scope="session")
def secured_kafka(test_ca: TestCA, other_ca: TestCA) -> Iterator[SecuredKafka]:
    """The session's secured Kafka broker (KRaft starts slowly: once); stopped by PID."""
    kafka = start_secured_kafka(test_ca, other_ca)
    try:
        yield kafka
    finally:
        kafka.broker.stop()


@pytest.fixture(scope="session")
def otlp_collector(test_ca: TestCA) -> Iterator[Collector]:
    """An OTLP/HTTP collector on HTTPS (the test CA's certificate) that keeps what it is sent."""
    with https_collector(test_ca.server(name="collector")) as collector:
        yield collector


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
    """A TLS Redis topology, its URL, the documented ACL user's name and password."""

    base_url: str
    tls: ServiceTLS
    user: str
    password: str
    ports: tuple[int, ...]  # the data nodes', where the ACL users live

    def url(self, *, user: str | None = None, password: str | None = None) -> str:
        """Return the topology's TLS URL as the ACL user (or another), with CA and client cert."""
        name, secret = user or self.user, self.password if password is None else password
        scheme, _, rest = self.base_url.partition("://")
        return f"{scheme}://{name}:{secret}@{rest}"

    def set_user(self, *argv: str) -> None:
        """Run ``ACL SETUSER ARGV`` on every data node (ACLs are per node, not replicated)."""
        for port in self.ports:
            with admin_client(port, self.tls) as admin:
                admin.execute_command("ACL", "SETUSER", *argv)


def _secured(base_url: str, tls: ServiceTLS, nodes: list[int]) -> SecureRedis:
    secured = SecureRedis(base_url, tls, "leaseworker", uuid.uuid4().hex, tuple(nodes))
    secured.set_user(*documented_acl(secured.user, secured.password)[2:])
    return secured


def _service_tls(test_ca: TestCA) -> ServiceTLS:
    return ServiceTLS(server=test_ca.server(), client=test_ca.client("leaseworker"))


@pytest.fixture(scope="session")
def redis_tls(test_ca: TestCA) -> Iterator[SecureRedis]:
    """One TLS-only Redis asking for client certificates, with the documented ACL user."""
    tls = _service_tls(test_ca)
    server = LocalRedis.start(tls=tls)
    try:
        yield _secured(server.url, tls, [server.port])
    finally:
        server.stop()


@pytest.fixture(scope="session")
def sentinel_tls(test_ca: TestCA) -> Iterator[SecureRedis]:
    """A Sentinel group (master, two replicas, three sentinels), all TLS only."""
    tls = _service_tls(test_ca)
    group = LocalSentinelGroup.start(tls=tls)
    try:
        yield _secured(group.url, tls, [node.port for node in group.servers])
    finally:
        group.stop()


@pytest.fixture(scope="session")
def cluster_tls(test_ca: TestCA) -> Iterator[tuple[SecureRedis, list[RedisNode]]]:
    """A six-node Cluster on TLS (``tls-cluster yes``), and its nodes."""
    tls = _service_tls(test_ca)
    cluster = LocalRedisCluster.start(tls=tls)
    try:
        yield _secured(cluster.url, tls, [node.port for node in cluster.nodes]), cluster.nodes
    finally:
        cluster.stop()


@pytest.fixture(params=["single", "sentinel", "cluster"])
def secured(request: pytest.FixtureRequest) -> SecureRedis:
    """Each TLS topology in turn (started once per session)."""
    if request.param == "cluster":
        topology, _nodes = request.getfixturevalue("cluster_tls")
        return topology  # type: ignore[no-any-return]
    return request.getfixturevalue(f"{'redis' if request.param == 'single' else 'sentinel'}_tls")  # type: ignore[no-any-return]


@pytest.fixture
def stack(
    secured_kafka: SecuredKafka,
    secured: SecureRedis,
    secure_postgres: SecurePostgres,
    otlp_collector: Collector,
    tmp_path: Path,
) -> SecuredStack:
    """Every secured peer at once (Redis: the topology of ``secured``), the test's topics."""
    from .stack import SecuredStack  # stack.py builds on this module's peers

    names = secured_kafka.names("pod")
    stack = SecuredStack(secured_kafka, secured, secure_postgres, otlp_collector, names, tmp_path)
    stack.prepare()
    return stack


@pytest.fixture
def pods() -> Iterator[list[PodProcess]]:
    """Pods a test starts; any still running at its end is killed."""
    started: list[PodProcess] = []
    yield started
    for pod in started:
        pod.kill()


def admin_client(port: int, tls: ServiceTLS) -> redis.Redis:
    """A synchronous client of the default (admin) user, over TLS; close it after use."""
    return redis.Redis(host="127.0.0.1", port=port, **tls.redis_kwargs())  # type: ignore[arg-type]
