"""A rotated SASL password: a running pod logs in again with the new one, or exits 2.

The pods connect to the broker's ``SASL_REAUTH`` listener, whose sessions end
after ``REAUTH_MS`` (``connections.max.reauth.ms``): aiokafka does not
re-authenticate, so the broker disconnects it and every client logs in
again, as it would after any reconnect. Each test has a SCRAM user of its own
whose password is changed on the broker (AlterUserScramCredentials) while the
pod runs; its job publishes through the outbox, so the relay's producer logs
in again too.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest

from leaseworker_dev._services import LocalRedis, PodProcess
from leaseworker_dev._services._kafka_acls import Acl

from ..kafka_util import KafkaNames, read_topic
from ..pods import spawn
from ..waiting import eventually
from .secured_kafka import REAUTH_MS, SecuredKafka
from .stack import JOB
from .test_kafka_sasl_ssl import REFUSAL_BOUND, _cli

ROTATED = "the Kafka SASL password file holds a new password"
"""The pod's one WARNING when it reconnects with a rotated password."""


def _rotating_pod(
    kafka: SecuredKafka, redis: LocalRedis, namespace: str, workdir: Path
) -> tuple[str, Path, KafkaNames, PodProcess]:
    """Start a pod as a new SCRAM user, its password from a file; return user, file, names, pod."""
    user, password = f"rot-{uuid.uuid4().hex[:8]}", secrets.token_hex(12)
    kafka.broker.set_scram_password(user, password)
    names = kafka.names(user)
    kafka.broker.create_topics([f"{names.topic}.ready"])
    kafka.broker.grant([Acl(f"User:{user}", "write", "topic", f"{names.topic}.ready")])
    secret = workdir / "kafka-password"
    secret.write_text(password + "\n")
    env = kafka.env(user=user) | {
        "LEASEWORKER_BOOTSTRAP_SERVERS": kafka.broker.address("SASL_REAUTH"),
        "LEASEWORKER_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
        "LEASEWORKER_KAFKA_SASL_PASSWORD_FILE": str(secret),
        "LEASEWORKER_SESSION_TIMEOUT": "2",  # the old member, which cannot log in, leaves soon
        "LEASEWORKER_REDIS_URL": redis.url,
        "LEASEWORKER_NAMESPACE": namespace,
        "LEASEWORKER_GROUP": names.group,
        "LEASEWORKER_DEAD_LETTER_TOPIC": names.dead_letters,
        "LW_TEST_TOPIC": names.topic,
        "LW_TEST_READY_TOPIC": f"{names.topic}.ready",
    }
    del env["LEASEWORKER_KAFKA_SASL_PASSWORD"]
    return user, secret, names, spawn(user, JOB, workdir, env, evidence=True)


def _trigger(kafka: SecuredKafka, names: KafkaNames, key: str) -> None:
    argv = ["trigger", names.topic, "--key", key, "--payload", "{}"]
    sent, _ = _cli(argv, kafka.env(user="admin"))
    assert sent.returncode == 0, sent.stderr


async def _wait(pod: PodProcess, check: Callable[[], Awaitable[bool]], *, within: float) -> None:
    """``eventually(check)``, failing with the pod's last log lines."""
    try:
        await eventually(check, within=within)
    except TimeoutError:
        pytest.fail(f"not within {within:.0f}s; the pod logged:\n{pod.log_text()[-4000:]}")


def _completed(pod: PodProcess) -> set[str]:
    return {e.job_key for e in pod.recorded().executions if e.outcome == "completed"}


async def test_a_pod_picks_up_a_rotated_sasl_password_file_without_a_restart(
    secured_kafka: SecuredKafka,
    redis_server: LocalRedis,
    namespace: str,
    pods: list[PodProcess],
    tmp_path: Path,
) -> None:
    """Broker and file changed: the pod logs in again with the file's password and goes on."""
    user, secret, names, pod = _rotating_pod(secured_kafka, redis_server, namespace, tmp_path)
    pods.append(pod)
    _trigger(secured_kafka, names, "report:rot:before")

    async def done(*keys: str) -> bool:
        return set(keys) <= _completed(pod)

    await _wait(pod, lambda: done("report:rot:before"), within=60)
    ready_topic, bootstrap = f"{names.topic}.ready", secured_kafka.broker.bootstrap_servers
    await read_topic(bootstrap, ready_topic, 1, within=30)  # the relay's producer: old password
    new = secrets.token_hex(12)
    secret.write_text(new + "\n")  # the Secret first (kubelet), then the broker
    secured_kafka.broker.set_scram_password(user, new)
    changed = time.monotonic()
    _trigger(secured_kafka, names, "report:rot:during")

    async def reconnected() -> bool:
        return ROTATED in pod.log_text()

    await _wait(pod, reconnected, within=30)  # the old password was refused: a real new login
    # The broker's bound, not a guess: by then every session that logged in with the
    # old password has ended, so the relay's producer must log in again to send "after".
    await anyio.sleep(max(0.0, changed + REAUTH_MS / 1000 - time.monotonic()))
    _trigger(secured_kafka, names, "report:rot:after")
    await _wait(pod, lambda: done("report:rot:during", "report:rot:after"), within=60)
    log = pod.log_text()
    assert pod.process.poll() is None, log[-3000:]
    assert log.count(ROTATED) == 1, log[-3000:]
    assert new not in log
    assert "SaslAuthenticationFailed" in log  # aiokafka logged the refused login: no timer
    relayed = await read_topic(bootstrap, ready_topic, 3, within=30)
    assert b"report:rot:after" in {record.key for record in relayed}  # the relay logged in again


async def test_a_revoked_sasl_password_without_a_new_file_exits_2_within_10_s(
    secured_kafka: SecuredKafka,
    redis_server: LocalRedis,
    namespace: str,
    pods: list[PodProcess],
    tmp_path: Path,
) -> None:
    """The broker's password changed, the file not: the next login is refused, the pod exits 2."""
    user, _secret, names, pod = _rotating_pod(secured_kafka, redis_server, namespace, tmp_path)
    pods.append(pod)
    _trigger(secured_kafka, names, "report:rot:ran")

    async def started() -> bool:  # every client running, not one still starting
        return "report:rot:ran" in _completed(pod)

    await _wait(pod, started, within=60)
    bootstrap = secured_kafka.broker.bootstrap_servers
    await read_topic(bootstrap, f"{names.topic}.ready", 1, within=30)  # the relay's too
    secured_kafka.broker.set_scram_password(user, secrets.token_hex(12))
    revoked = time.monotonic()
    code = await pod.wait_exit(REFUSAL_BOUND)
    took = time.monotonic() - revoked
    log = pod.log_text()
    assert code == 2, log[-3000:]
    assert took < REFUSAL_BOUND
    [line] = [line for line in log.splitlines() if "error:" in line]
    assert f"SASL authentication failed for user {user!r}" in line
    assert ROTATED not in log
