"""Security: Kafka SASL/TLS reach the clients, secrets stay out of reprs and logs.

The Redis ACL documented in docs/operations.md is applied to a real Redis and
shown to be enough for the lease scripts, and no more.
"""

from __future__ import annotations

import re
import shlex
import ssl
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import NoPermissionError

from leaseworker import ConfigError, PodConfig, RedisLeases
from leaseworker._cli._main import build_parser
from leaseworker._cli._run_command import build_config
from leaseworker._kafka import KafkaSecurity, new_consumer, new_producer
from leaseworker_dev._services import LocalKafka, LocalRedis, PodProcess, free_port

from ..health_util import probe
from ..kafka_util import KafkaNames
from ..waiting import eventually

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
KAFKA_PASSWORD = f"kafka-secret-{uuid.uuid4().hex}"


def _ca_file() -> str:
    """A real CA bundle on this machine (create_ssl_context loads it)."""
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile, "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return candidate
    pytest.skip("no CA bundle on this machine to build an SSL context from")


async def test_sasl_ssl_settings_reach_the_consumer_and_producer() -> None:
    """security_protocol, SASL mechanism/user/password and the CA's context go to aiokafka."""
    security = KafkaSecurity(
        protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="reports",
        sasl_password=KAFKA_PASSWORD,
        ssl_cafile=_ca_file(),
    )
    config = PodConfig(kafka_security=security, dead_letter_topic="dead")
    for client in (new_consumer(config, "t"), new_producer(config)):
        inner = getattr(client, "_client", None) or client.client
        await client.stop()  # never started: closes what the constructor opened
        assert inner._security_protocol == "SASL_SSL"
        assert inner._sasl_mechanism == "SCRAM-SHA-512"
        assert inner._sasl_plain_username == "reports"
        assert inner._sasl_plain_password == KAFKA_PASSWORD
        assert isinstance(inner._ssl_context, ssl.SSLContext)


def test_kafka_flags_and_env_vars_build_the_security_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """LEASEWORKER_KAFKA_* variables and --kafka-* flags fill KafkaSecurity (flags win)."""
    monkeypatch.setenv("LEASEWORKER_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("LEASEWORKER_KAFKA_SASL_USERNAME", "env-user")
    monkeypatch.setenv("LEASEWORKER_KAFKA_SASL_PASSWORD", KAFKA_PASSWORD)
    args = build_parser().parse_args(
        ["run", "--kafka-sasl-mechanism", "SCRAM-SHA-256", "tests.jobs:MarkerJob"]
    )
    security = build_config(args).kafka_security
    assert (security.protocol, security.mechanism) == ("SASL_PLAINTEXT", "SCRAM-SHA-256")
    assert (security.sasl_username, security.sasl_password) == ("env-user", KAFKA_PASSWORD)
    args = build_parser().parse_args(
        ["run", "--kafka-sasl-username", "flag-user", "tests.jobs:MarkerJob"]
    )
    assert build_config(args).kafka_security.sasl_username == "flag-user"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"protocol": "TLS"}, "protocol must be one of"),
        ({"protocol": "SSL", "sasl_username": "u", "sasl_password": "p"}, "use SASL_SSL"),
        ({"protocol": "SASL_SSL", "sasl_username": "u"}, "needs a SASL username and password"),
        ({"protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI", "sasl_username": "u",
          "sasl_password": "p"}, "mechanism must be one of"),
        ({"protocol": "PLAINTEXT", "ssl_cafile": "/etc/hostname"}, "use SSL or SASL_SSL"),
        ({"protocol": "SSL", "ssl_cafile": "/nonexistent/ca.crt"}, "CA file not found"),
    ],
)  # fmt: skip
def test_inconsistent_kafka_security_is_a_config_error(
    settings: dict[str, str], message: str
) -> None:
    """Settings aiokafka would reject late (or silently ignore) fail at construction."""
    with pytest.raises(ConfigError, match=message):
        KafkaSecurity(**settings)


def test_reprs_never_show_passwords() -> None:
    """Neither PodConfig (Redis URL) nor KafkaSecurity (SASL password) prints a secret."""
    redis_password = f"redis-secret-{uuid.uuid4().hex}"
    config = PodConfig(
        redis_url=f"rediss://leaseworker:{redis_password}@redis:6380/0",
        kafka_security=KafkaSecurity(
            protocol="SASL_PLAINTEXT", sasl_username="u", sasl_password=KAFKA_PASSWORD
        ),
    )
    for text in (repr(config), str(config), repr(config.kafka_security)):
        assert redis_password not in text
        assert KAFKA_PASSWORD not in text
    assert "sasl_password='***'" in repr(config.kafka_security)
    assert config.redacted_redis() == "redis:6380"


# -- the documented Redis ACL, on a real Redis -------------------------------------------


def _documented_acl() -> list[str]:
    [line] = [
        line.strip()
        for line in DOCS.read_text().splitlines()
        if line.strip().startswith("ACL SETUSER ")
    ]
    return shlex.split(line)


@pytest.fixture
async def acl_user(redis: Redis) -> AsyncIterator[tuple[str, str]]:
    """A user created with the documented ACL line (name and password replaced), then deleted."""
    argv = _documented_acl()
    user, password = f"lw-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    argv[2] = user
    argv = [f">{password}" if arg == ">CHANGE-ME" else arg for arg in argv]
    await redis.execute_command(*argv)  # type: ignore[no-untyped-call]
    yield user, password
    await redis.execute_command("ACL", "DELUSER", user)  # type: ignore[no-untyped-call]


async def test_the_documented_acl_runs_the_lease_scripts_and_nothing_else(
    redis_server: LocalRedis, acl_user: tuple[str, str]
) -> None:
    """As the ACL user: acquire, renew, inspect and release work; other keys are refused."""
    user, password = acl_user
    client = Redis(host="127.0.0.1", port=redis_server.port, username=user, password=password)
    try:
        await client.script_flush()  # not in the ACL: proves the user is restricted
    except NoPermissionError:
        pass
    else:
        raise AssertionError("the ACL user may flush scripts")
    try:
        leases = RedisLeases(client, namespace="leaseworker", command_timeout=2.0)
        key = f"report:acl:{uuid.uuid4().hex[:8]}"
        lease = await leases.acquire(key, 10.0)
        assert lease is not None
        renewed = await leases.renew(lease)
        info = await leases.inspect(key)
        assert info.fence == renewed.fence
        assert await leases.release(renewed) is True
        assert await client.ping() is True
        with pytest.raises(NoPermissionError):
            await client.set("other-app:key", "x")
        outside = RedisLeases(client, namespace="other-app", command_timeout=2.0)
        with pytest.raises(Exception, match=r"(?i)permission|NOPERM"):
            await outside.acquire(key, 10.0)
    finally:
        await client.aclose()


# -- a real pod with secrets in its environment -----------------------------------------


async def test_a_pod_never_logs_or_serves_its_redis_or_kafka_password(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    acl_user: tuple[str, str],
    health_pods: Callable[..., PodProcess],
) -> None:
    """With DEBUG logs, an ACL user in the Redis URL and a rejected SASL login, no secret leaks.

    The broker speaks PLAINTEXT, so the SASL handshake that carries the
    password is refused: a refusal retrying cannot fix, so the pod exits 2
    with one line naming Kafka (it used to retry forever). A second pod,
    whose brokers are not there yet, keeps waiting and serves /readyz.
    """
    user, redis_password = acl_user
    port = free_port()
    env = {
        "LEASEWORKER_BOOTSTRAP_SERVERS": kafka_server.bootstrap_servers,
        "LEASEWORKER_REDIS_URL": f"redis://{user}:{redis_password}@127.0.0.1:{redis_server.port}/0",
        "LEASEWORKER_GROUP": kafka_names.group,
        "LEASEWORKER_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "LEASEWORKER_KAFKA_SASL_USERNAME": "reports",
        "LEASEWORKER_KAFKA_SASL_PASSWORD": KAFKA_PASSWORD,
        "LEASEWORKER_HEALTH_PORT": str(port),
        "LEASEWORKER_HEALTH_HOST": "127.0.0.1",
        "LW_TEST_TOPIC": kafka_names.topic,
    }
    refused = health_pods("pod-s", "tests.jobs:MarkerJob", env)
    assert await refused.wait_exit(within=30) == 2
    assert re.search(r"error: Kafka at .* refused the connection: SASL", refused.log_text())
    env["LEASEWORKER_BOOTSTRAP_SERVERS"] = f"127.0.0.1:{free_port()}"
    env["LEASEWORKER_HEALTH_PORT"] = str(port := free_port())
    pod = health_pods("pod-w", "tests.jobs:MarkerJob", env)

    async def kafka_retried() -> bool:
        return re.search(r"Kafka at .* unavailable for the consumer", pod.log_text()) is not None

    await eventually(kafka_retried, within=60)
    status, body = await probe(port, "/readyz")
    assert status == 503
    assert body["redis"]["answered"] is True  # the documented ACL is enough for PING
    served = str(body) + str(await probe(port, "/healthz"))
    for secret in (KAFKA_PASSWORD, redis_password):
        assert secret not in refused.log_text() + pod.log_text()
        assert secret not in served
