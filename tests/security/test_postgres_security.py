"""PostgreSQL with TLS (verify-full against the test CA), SCRAM and least-privilege roles.

The pods' role reads and writes the store's tables and changes no schema; the
owner migrates once (``leaseworker store migrate``). Every refusal exits 2
within 10 s with one line naming the store and the reason, never a password.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from leaseworker import CompletionRequest, ConfigError, open_store
from leaseworker._store import MIGRATIONS, Message, effect_store
from leaseworker_dev._services import LocalPostgres, LocalRedis, TestCA

from ..pods import REPO
from .cli import leaseworker, run_pod
from .conftest import OWNER, RUNTIME, SecurePostgres

LATEST = MIGRATIONS[-1].version  # what `store migrate` brings a fresh database to


async def test_the_runtime_role_completes_through_verify_full(
    secure_postgres: SecurePostgres,
) -> None:
    """sslmode=verify-full with the test CA and a SCRAM password: the store works end to end."""
    url = secure_postgres.url(RUNTIME)
    assert "sslmode=verify-full" in url
    key = f"tls:{uuid.uuid4().hex[:8]}"
    async with open_store(url) as store:
        request = CompletionRequest(
            job_key=key,
            input_version="v1",
            fence=1,
            result={"ok": True},
            execution_id="e1",
            pod="p",
        )
        assert (await store.complete(request)).status == "accepted"
        assert (await store.lookup(key, "v1")) is not None
    with psycopg.connect(url) as conn:
        assert conn.pgconn.ssl_in_use
        used = conn.execute("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        assert used.fetchone() == (True, "TLSv1.3")


def test_the_runtime_role_cannot_change_the_schema(secure_postgres: SecurePostgres) -> None:
    """The grants are DML only: CREATE and DROP are refused to the pods' role."""
    with psycopg.connect(secure_postgres.url(RUNTIME), autocommit=True) as conn:
        for statement in ("CREATE TABLE intruder (x int)", "DROP TABLE leaseworker_jobs"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement.encode())


def test_store_migrate_creates_the_schema_and_grants_the_runtime_role(
    secure_postgres: SecurePostgres,
) -> None:
    """The owner's one-off command on a fresh database; then the runtime role can open it."""
    database = f"fresh_{uuid.uuid4().hex[:8]}"
    secure_postgres.server.execute(f"CREATE DATABASE {database} OWNER {OWNER}".encode())
    owner_url = secure_postgres.url(OWNER, database=database)
    ended = leaseworker("store", "migrate", "--grant-to", RUNTIME, env={
        "LEASEWORKER_STORE_URL": owner_url
    })  # fmt: skip
    assert ended.code == 0, ended.stderr
    assert json.loads(ended.stdout) == {"schema_version": LATEST, "granted_to": [RUNTIME]}
    with psycopg.connect(secure_postgres.url(RUNTIME, database=database)) as conn:
        row = conn.execute("SELECT max(version) FROM leaseworker_schema_version").fetchone()
        assert row is not None
        assert row[0] == LATEST
        assert _granted(conn) == _documented(conn)


PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
OUTBOX_TABLES = {"leaseworker_outbox", "leaseworker_outbox_unsent", "leaseworker_outbox_sent"}


def _granted(conn: psycopg.Connection[tuple[object, ...]]) -> dict[str, set[str]]:
    """Each store table and view with every privilege the session's role holds on it."""
    rows = conn.execute(
        "SELECT c.relname, p FROM pg_class c, unnest(%s::text[]) AS p"
        " WHERE c.relkind IN ('r', 'v') AND c.relname LIKE 'leaseworker\\_%%'"
        " AND has_table_privilege(c.oid, p)",
        (list(PRIVILEGES),),
    ).fetchall()
    granted: dict[str, set[str]] = {}
    for table, privilege in rows:
        granted.setdefault(str(table), set()).add(str(privilege))
    return granted


def _documented(conn: psycopg.Connection[tuple[object, ...]]) -> dict[str, set[str]]:
    """What ``store migrate --help`` and docs/operations.md say the runtime role gets."""
    tables = conn.execute(
        "SELECT relname, relkind = 'v' FROM pg_class"
        " WHERE relkind IN ('r', 'v') AND relname LIKE 'leaseworker\\_%'"
    ).fetchall()
    documented: dict[str, set[str]] = {}
    for table, view in tables:
        if view or table == "leaseworker_schema_version":
            documented[str(table)] = {"SELECT"}
        else:
            extra = {"DELETE"} if table in OUTBOX_TABLES else set()
            documented[str(table)] = {"SELECT", "INSERT", "UPDATE", *extra}
    return documented


def test_the_help_and_the_operations_page_name_the_grants_store_migrate_makes() -> None:
    """SELECT, INSERT, UPDATE; DELETE on the outbox's tables; SELECT on the version table."""
    help_text = " ".join(leaseworker("store", "migrate", "--help").stdout.split())
    assert "grant it SELECT, INSERT, UPDATE on the store's tables, DELETE too on the outbox's" in (
        help_text
    )
    assert "SELECT on its version table and views" in help_text
    page = (REPO / "docs" / "operations.md").read_text()
    assert "GRANT SELECT ON leaseworker_schema_version and the views;" in page
    assert "SELECT, INSERT, UPDATE ON every other\n#   leaseworker_* table," in page
    assert "DELETE too on leaseworker_outbox{,_unsent,_sent}" in page


async def test_the_runtime_role_deletes_what_its_relay_sent_and_prunes(
    secure_postgres: SecurePostgres,
) -> None:
    """A relay's mark deletes queue rows, the retention sent rows: both need the DELETE granted."""
    key = f"grants:{{{uuid.uuid4().hex[:8]}}}"
    async with open_store(secure_postgres.url(RUNTIME)) as opened:
        store = effect_store(opened)
        async with store.transaction(key, "v1", 1) as tx:
            request = CompletionRequest(
                job_key=key, input_version="v1", fence=1, result=None, execution_id="e", pod="p"
            )
            await tx.commit(request, [Message.build("reports.ready", {"n": 1})])
        [claimed] = await store.claim_outbox("relay-a", limit=10, hold=30)
        assert await store.mark_sent("relay-a", [claimed.id]) == 1
        assert await store.prune_outbox(0.0) >= 1
        assert await store.outbox_entries(key) == []


@pytest.mark.parametrize(
    ("role", "password"),
    [(RUNTIME, "wrong-password-9f3a"), ("nobody_here", "wrong-password-9f3a")],
    ids=["wrong-password", "unknown-user"],
)
def test_a_refused_login_exits_2_naming_the_store(
    secure_postgres: SecurePostgres, redis_server: LocalRedis, role: str, password: str
) -> None:
    """28P01 (both: SCRAM does not tell an unknown user from a wrong password): exit 2 at once."""
    url = secure_postgres.server.url_for("store", role=role, password=password)
    line = run_pod("--redis-url", redis_server.url, "--store-url", url).refusal()
    assert line.startswith("leaseworker run: error: completion store at postgresql://")
    assert "refused the connection after the password" in line
    assert "wrong-password-9f3a" not in line


def test_a_database_that_does_not_exist_exits_2(
    secure_postgres: SecurePostgres, redis_server: LocalRedis
) -> None:
    """3D000 comes after the password too: permanent."""
    url = secure_postgres.url(RUNTIME, database="no_such_db")
    line = run_pod("--redis-url", redis_server.url, "--store-url", url).refusal()
    assert "refused the connection" in line
    assert "no_such_db" in line


def test_plain_text_is_refused_by_the_server_and_exits_2(
    secure_postgres: SecurePostgres, redis_server: LocalRedis
) -> None:
    """sslmode=disable meets ``hostnossl ... reject``: refused before any password."""
    url = secure_postgres.url(RUNTIME, sslmode="disable")
    line = run_pod("--redis-url", redis_server.url, "--store-url", url).refusal()
    assert "refused the connection at once" in line


def test_an_unknown_ca_exits_2_with_openssls_reason(
    secure_postgres: SecurePostgres, redis_server: LocalRedis, other_ca: TestCA
) -> None:
    """verify-full against another CA: the handshake fails on the client; permanent."""
    url = secure_postgres.url(RUNTIME, sslrootcert=str(other_ca.ca_file))
    line = run_pod("--redis-url", redis_server.url, "--store-url", url).refusal()
    assert "TLS certificate refused" in line
    assert secure_postgres.passwords[RUNTIME] not in line


@pytest.fixture(scope="module")
def misissued_postgres(test_ca: TestCA) -> Iterator[LocalPostgres]:
    """A TLS PostgreSQL whose certificate the tests replace (expired, another host's)."""
    server = LocalPostgres.start(tls=test_ca.server())
    yield server
    server.stop()


@pytest.mark.parametrize(
    ("certificate", "reason"),
    [
        ("expired", "certificate has expired"),
        ("other-host", "mismatch, certificate is not valid for"),
    ],
)
def test_an_expired_or_misnamed_server_certificate_exits_2(
    misissued_postgres: LocalPostgres,
    test_ca: TestCA,
    redis_server: LocalRedis,
    certificate: str,
    reason: str,
) -> None:
    """Both are refused by the client; the line carries OpenSSL's reason, in English."""
    files = (
        test_ca.server(expired=True)
        if certificate == "expired"
        else test_ca.server(hosts=("db.invalid",))
    )
    misissued_postgres.replace_certificate(files)
    url = misissued_postgres.url_for("leaseworker")
    line = run_pod("--redis-url", redis_server.url, "--store-url", url).refusal()
    assert "TLS certificate refused" in line
    assert reason in line


def test_a_missing_schema_exits_2_with_the_migrate_hint(
    secure_postgres: SecurePostgres, redis_server: LocalRedis
) -> None:
    """The pods' role may not create the schema: one line says who should, and how."""
    database = f"empty_{uuid.uuid4().hex[:8]}"
    secure_postgres.server.execute(f"CREATE DATABASE {database} OWNER {OWNER}".encode())
    url = secure_postgres.url(RUNTIME, database=database)
    line = run_pod("--redis-url", redis_server.url, "--store-url", url).refusal()
    assert "schema is at version 0 of" in line
    assert "leaseworker store migrate --store-url <owner URL>" in line


def test_a_role_lacking_one_privilege_exits_2_naming_it(
    secure_postgres: SecurePostgres, redis_server: LocalRedis
) -> None:
    """The runtime grants minus UPDATE on leaseworker_jobs: the start-up check names it."""
    role = f"lw_partial_{uuid.uuid4().hex[:6]}"
    secure_postgres.add_role(role)
    for grant in (
        "GRANT SELECT ON leaseworker_schema_version TO {role}",
        "GRANT SELECT, INSERT, UPDATE ON leaseworker_completions TO {role}",
        "GRANT SELECT, INSERT ON leaseworker_jobs TO {role}",
    ):
        secure_postgres.server.execute(grant.format(role=role).encode(), database="store")
    url = secure_postgres.url(role)
    line = run_pod("--redis-url", redis_server.url, "--store-url", url).refusal()
    assert "the role lacks UPDATE on leaseworker_jobs" in line


async def test_a_server_that_is_down_is_waited_for_not_refused(
    secure_postgres: SecurePostgres,
) -> None:
    """Nothing listens: StoreUnavailable (the pod retries with its WARNING), not ConfigError."""
    from leaseworker import StoreUnavailable
    from leaseworker_dev._services import free_port

    url = secure_postgres.url(RUNTIME).replace(
        f":{secure_postgres.server.port}/", f":{free_port()}/"
    )
    with pytest.raises(StoreUnavailable):
        async with open_store(url, call_timeout=1):
            pass
    assert not issubclass(StoreUnavailable, ConfigError)


@pytest.fixture(scope="module")
def german_postgres() -> Iterator[LocalPostgres]:
    """A PostgreSQL whose messages are German (de_DE compiled into a directory of its own)."""
    if shutil.which("localedef") is None or not Path("/usr/share/i18n/locales/de_DE").exists():
        pytest.skip("no localedef or de_DE locale source to compile a German locale from")
    locales = Path(tempfile.mkdtemp(prefix="leaseworker-locale-"))
    locales.chmod(0o755)
    try:
        subprocess.run(
            ["localedef", "-i", "de_DE", "-f", "UTF-8", str(locales / "de_DE.UTF-8")],
            check=True,
            capture_output=True,
            timeout=120,
        )
        server = LocalPostgres.start(
            settings={"lc_messages": "de_DE.UTF-8"}, env={"LOCPATH": str(locales)}
        )
        try:
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(locales, ignore_errors=True)


def test_a_refused_login_in_german_exits_2_all_the_same(
    german_postgres: LocalPostgres, redis_server: LocalRedis
) -> None:
    """The classification reads no message text: a German 28P01 is permanent too."""
    url = german_postgres.url_for("leaseworker", password="falsch-8d2")
    line = run_pod("--redis-url", redis_server.url, "--store-url", url).refusal()
    assert "refused the connection after the password" in line
    assert "Passwort-Authentifizierung" in line  # the server's own words, shown
    assert "falsch-8d2" not in line
