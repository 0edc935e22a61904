"""Credentials from files (the ``*_FILE`` convention), read again on every reconnect.

A Kubernetes Secret mounted as a volume is updated in place when it is
rotated; the pod must pick the new password up when it next connects,
without a restart. Redis reads the URL's credentials for every new
connection, the store's pool the URL for every new connection.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import psycopg
import pytest
from redis.asyncio import Redis

from leaseworker import ConfigError, open_store
from leaseworker._cli._main import build_parser
from leaseworker._cli._run_command import build_config
from leaseworker._lease import redis_from_url

from .cli import leaseworker, run_pod
from .conftest import SecurePostgres, SecureRedis, admin_client, documented_acl


def _rotating_user(redis_tls: SecureRedis) -> tuple[str, str]:
    user, password = f"lw-rot-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    redis_tls.set_user(*documented_acl(user, password)[2:])
    return user, password


async def test_tls_a_rotated_redis_url_file_is_used_on_reconnect(
    redis_tls: SecureRedis, tmp_path: Path
) -> None:
    """Old password removed, file rewritten: the next connection authenticates with the new one."""
    user, old = _rotating_user(redis_tls)
    secret = tmp_path / "redis-url"
    secret.write_text(redis_tls.url(user=user, password=old) + "\n")
    client = redis_from_url(secret.read_text().strip(), connect_timeout=2.0, url_file=secret)
    try:
        assert await client.ping()
        new = uuid.uuid4().hex
        redis_tls.set_user(user, f">{new}", f"<{old}")
        secret.write_text(redis_tls.url(user=user, password=new))
        with admin_client(redis_tls.ports[0], redis_tls.tls) as admin:
            admin.execute_command("CLIENT", "KILL", "USER", user)  # the Secret's rotation
        assert isinstance(client, Redis)
        await client.connection_pool.disconnect()
        assert await client.ping()  # a new connection: only the new password is valid now
    finally:
        await client.aclose()


async def test_a_rotated_store_url_file_is_used_by_new_pooled_connections(
    secure_postgres: SecurePostgres, tmp_path: Path
) -> None:
    """ALTER ROLE ... PASSWORD, the file rewritten, the old sessions ended: the store goes on."""
    role = f"lw_rot_{uuid.uuid4().hex[:6]}"
    old = secure_postgres.add_role(role)
    secure_postgres.server.execute(f"GRANT {'lw_runtime'} TO {role}".encode())
    secret = tmp_path / "store-url"
    secret.write_text(secure_postgres.url(role) + "\n")
    async with open_store(url_file=secret, call_timeout=5) as store:
        assert await store.lookup("rotation", "v1") is None
        new = uuid.uuid4().hex
        secure_postgres.server.execute(f"ALTER ROLE {role} PASSWORD '{new}'".encode())
        secret.write_text(secure_postgres.url(role).replace(old, new))
        ended = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = "
        secure_postgres.server.execute(f"{ended}'{role}'".encode())
        assert await store.lookup("rotation", "v1") is None  # reconnected as the new password
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(secure_postgres.url(role), connect_timeout=3).close()  # old one: gone


def test_url_files_and_the_kafka_password_file_come_from_flags_and_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--redis-url-file, --store-url-file, LEASEWORKER_KAFKA_SASL_PASSWORD_FILE: one mechanism."""
    redis_file, store_file, kafka_file = (tmp_path / n for n in ("redis", "store", "kafka"))
    redis_file.write_text("rediss://lw:redis-pw@redis:6380/0\n")
    store_file.write_text("postgresql://lw:store-pw@db/reports\n")
    kafka_file.write_text("kafka-pw\n")
    monkeypatch.setenv("LEASEWORKER_REDIS_URL_FILE", str(redis_file))
    monkeypatch.setenv("LEASEWORKER_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("LEASEWORKER_KAFKA_SASL_USERNAME", "lw")
    monkeypatch.setenv("LEASEWORKER_KAFKA_SASL_PASSWORD_FILE", str(kafka_file))
    argv = ["run", "--store-url-file", str(store_file), "--redis-ca-file", "/ca.crt"]
    config = build_config(build_parser().parse_args([*argv, "tests.jobs:MarkerJob"]))
    assert config.redis_url == "rediss://lw:redis-pw@redis:6380/0?ssl_ca_certs=/ca.crt"
    assert config.redis_url_file == redis_file
    assert (config.store_url, config.store_url_file) == (
        "postgresql://lw:store-pw@db/reports",
        store_file,
    )
    assert config.kafka_security.sasl_password_file == str(kafka_file)
    assert config.kafka_security.password() == "kafka-pw"  # read again for each client
    for text in (repr(config), repr(config.kafka_security)):
        assert "pw" not in text.replace("sasl_password", "")


def test_a_value_and_its_file_together_are_refused(tmp_path: Path) -> None:
    """Which one would win is not obvious: name both and refuse."""
    secret = tmp_path / "redis"
    secret.write_text("redis://redis:6379/0")
    args = build_parser().parse_args(
        ["run", "--redis-url", "redis://other:6379/0", "--redis-url-file", str(secret), "x:Y"]
    )
    with pytest.raises(ConfigError, match="give --redis-url or --redis-url-file, not both"):
        build_config(args)


def test_tls_a_pod_reads_its_redis_url_from_the_file(
    redis_tls: SecureRedis, tmp_path: Path
) -> None:
    """A wrong password in the file: the pod read it (and only it), and exits 2 without it."""
    secret = tmp_path / "redis-url"
    secret.write_text(redis_tls.url(password="file-secret-4e2"))
    ended = run_pod("--store-url", "memory://", env={"LEASEWORKER_REDIS_URL_FILE": str(secret)})
    assert "refused the credentials" in ended.refusal()
    assert "file-secret-4e2" not in ended.stderr


def test_an_unreadable_secret_file_exits_2_naming_the_path(tmp_path: Path) -> None:
    """One line with the setting and the path; nothing of a content."""
    missing = tmp_path / "no-such-secret"
    line = run_pod("--store-url-file", str(missing)).refusal()
    assert f"cannot read --store-url-file {missing}" in line


def test_tls_inspect_reads_through_the_secured_peers_with_url_files(
    redis_tls: SecureRedis, secure_postgres: SecurePostgres, tmp_path: Path
) -> None:
    """``leaseworker inspect`` as the ACL user and the runtime role, both URLs from files."""
    redis_file, store_file = tmp_path / "redis-url", tmp_path / "store-url"
    redis_file.write_text(redis_tls.url().partition("?")[0])
    store_file.write_text(secure_postgres.url("lw_runtime"))
    files = redis_tls.tls
    ended = leaseworker(
        "inspect",
        "report:never-run",
        "--redis-url-file",
        str(redis_file),
        "--redis-ca-file",
        str(files.server.ca),
        "--redis-cert-file",
        str(files.client.cert),
        "--redis-key-file",
        str(files.client.key),
        env={"LEASEWORKER_STORE_URL_FILE": str(store_file)},
    )
    assert ended.code == 0, ended.stderr
    assert json.loads(ended.stdout)["fence"] is None
