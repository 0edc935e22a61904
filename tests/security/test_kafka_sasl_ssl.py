"""Kafka over SASL_SSL (SCRAM, PLAIN) and SSL (mutual TLS) against a real broker with ACLs.

A pod under exactly its ACLs runs a trigger end to end and dead-letters a
malformed one; every refusal (credentials, certificates, a missing ACL)
exits 2 with one line naming Kafka and the reason, without the password,
within 10 s, from ``run``, ``trigger`` and ``topics create``; a broker that is
merely not there is still waited for.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from leaseworker import KafkaSecurity
from leaseworker_dev._embedded import PodFactory
from leaseworker_dev._services import LocalRedis, PodProcess, free_port

from ..jobs import MarkerJob
from ..kafka_util import produce, read_topic
from ..pods import LEASEWORKER, REPO, spawn_pod
from ..waiting import eventually
from .secured_kafka import SecuredKafka

REFUSAL_BOUND = 10.0
"""Seconds within which a refused command must have exited 2."""


def _cli(
    argv: list[str], env: dict[str, str], *, drop: tuple[str, ...] = ()
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``leaseworker ARGV`` with ``env`` added (``drop`` removed); return result, duration."""
    full_env = {**os.environ, **env}
    for name in drop:
        full_env.pop(name, None)
    started = time.monotonic()
    result = subprocess.run(
        [LEASEWORKER, *argv],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return result, time.monotonic() - started


def _refused_line(result: subprocess.CompletedProcess[str], took: float, secret: str) -> str:
    """Check a refusal: exit 2, in time, one line, no traceback, no secret; return the line."""
    assert result.returncode == 2, result.stderr[-2000:]
    assert took < REFUSAL_BOUND, f"took {took:.1f}s"
    assert "Traceback" not in result.stderr
    assert secret not in result.stderr + result.stdout
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr[-2000:]
    return errors[0]


@pytest.fixture
def pod_env(redis_server: LocalRedis, namespace: str) -> dict[str, str]:
    """The non-Kafka settings of a test pod."""
    return {
        "LEASEWORKER_REDIS_URL": redis_server.url,
        "LEASEWORKER_NAMESPACE": namespace,
        "LW_TEST_LEASE": "3",
    }


@pytest.mark.parametrize("listener", ["SASL_SSL", "SSL"])
async def test_a_pod_under_its_acls_runs_end_to_end_over_sasl_ssl_scram_and_mutual_ssl(
    secured_kafka: SecuredKafka,
    pod_env: dict[str, str],
    pods: list[PodProcess],
    tmp_path: Path,
    listener: str,
) -> None:
    """SCRAM-SHA-512 over SASL_SSL (password file), or a client certificate over SSL.

    The principal has Read on its group and job topic and Write on its
    dead-letter topic, nothing else; ``trigger`` sends over SASL_SSL as a
    producer principal (the admin), and the pod completes both jobs.
    """
    names = secured_kafka.names("pod")
    env = secured_kafka.env(listener) | pod_env
    env |= {
        "LEASEWORKER_GROUP": names.group,
        "LEASEWORKER_DEAD_LETTER_TOPIC": names.dead_letters,
        "LW_TEST_TOPIC": names.topic,
    }
    if listener == "SASL_SSL":  # the password from a file, as a mounted Secret
        secret = tmp_path / "kafka-password"
        secret.write_text(env.pop("LEASEWORKER_KAFKA_SASL_PASSWORD") + "\n")
        env["LEASEWORKER_KAFKA_SASL_PASSWORD_FILE"] = str(secret)
    pods.append(spawn_pod("secured-pod", tmp_path, env))
    producer = secured_kafka.env(user="admin")  # the pod may not write its job topic
    for key in ("report:tls:1", "report:tls:2"):
        sent, _ = _cli(["trigger", names.topic, "--key", key, "--payload", "{}"], producer)
        assert sent.returncode == 0, sent.stderr

    async def completed() -> bool:
        executions = pods[0].recorded().executions
        done = {e.job_key for e in executions if e.outcome == "completed"}
        return done >= {"report:tls:1", "report:tls:2"}

    await eventually(completed, within=60)
    assert pods[0].process.poll() is None, pods[0].log_text()[-3000:]
    assert secured_kafka.passwords["pod"] not in pods[0].log_text()


async def test_a_malformed_trigger_is_dead_lettered_under_the_write_acl_over_sasl_ssl(
    secured_kafka: SecuredKafka, pod_env: dict[str, str], pods: list[PodProcess], tmp_path: Path
) -> None:
    """Write on the dead-letter topic is enough for the pod's dead-letter producer."""
    names = secured_kafka.names("pod")
    env = secured_kafka.env() | pod_env
    env |= {
        "LEASEWORKER_GROUP": names.group,
        "LEASEWORKER_DEAD_LETTER_TOPIC": names.dead_letters,
        "LW_TEST_TOPIC": names.topic,
    }
    pods.append(spawn_pod("dl-pod", tmp_path, env))
    # The admin (a super user) works through SASL_SSL too.
    created, _ = _cli(
        ["topics", "create", names.topic, "--if-not-exists"], secured_kafka.env(user="admin")
    )
    assert created.returncode == 0, created.stderr
    await produce(secured_kafka.broker.bootstrap_servers, names.topic, [(b"k", b"not json")])
    [record] = await read_topic(secured_kafka.broker.bootstrap_servers, names.dead_letters, 1)
    assert record.value == b"not json"


def _refusal_cases(kafka: SecuredKafka) -> dict[str, tuple[dict[str, str], str]]:
    """Each refusal: the settings that provoke it and what its one line must say."""
    other_ca = str(kafka.other_ca.ca_file)
    return {
        "sasl wrong password": (
            kafka.env(LEASEWORKER_KAFKA_SASL_PASSWORD="wrong-" + kafka.passwords["pod"]),
            "SASL authentication failed for user 'pod'",
        ),
        "sasl unknown user": (kafka.env(user="nobody"), "SASL authentication failed"),
        "sasl plain wrong password": (
            kafka.env(
                user="plainpod",
                LEASEWORKER_KAFKA_SASL_MECHANISM="PLAIN",
                LEASEWORKER_KAFKA_SASL_PASSWORD="wrong-" + kafka.passwords["plainpod"],
            ),
            "SASL authentication failed for user 'plainpod' (PLAIN)",
        ),
        "ssl unknown ca": (
            kafka.env(LEASEWORKER_KAFKA_CA_FILE=other_ca),
            "unable to get local issuer certificate",
        ),
        "ssl hostname mismatch": (
            kafka.env("SSL", LEASEWORKER_BOOTSTRAP_SERVERS=kafka.broker.address("WRONGHOST")),
            "mismatch",
        ),
        "ssl no client certificate": (
            kafka.env("SSL", LEASEWORKER_KAFKA_CERT_FILE="", LEASEWORKER_KAFKA_KEY_FILE=""),
            "the broker refused the client's TLS certificate",
        ),
        "ssl client certificate of another ca": (
            kafka.env(
                "SSL",
                LEASEWORKER_KAFKA_CERT_FILE=str(kafka.stranger.cert),
                LEASEWORKER_KAFKA_KEY_FILE=str(kafka.stranger.key),
            ),
            "the broker refused the client's TLS certificate",
        ),
        "ssl expired certificate": (
            kafka.env("SSL", LEASEWORKER_BOOTSTRAP_SERVERS=kafka.broker.address("EXPIRED")),
            "certificate has expired",
        ),
    }


REFUSALS = [
    "sasl wrong password",
    "sasl unknown user",
    "sasl plain wrong password",
    "ssl unknown ca",
    "ssl hostname mismatch",
    "ssl expired certificate",
    "ssl no client certificate",
    "ssl client certificate of another ca",
]


@pytest.mark.parametrize("command", ["run", "trigger", "topics"])
@pytest.mark.parametrize("case", REFUSALS)
def test_each_sasl_and_ssl_refusal_exits_2_with_one_line_naming_kafka(
    secured_kafka: SecuredKafka, pod_env: dict[str, str], case: str, command: str
) -> None:
    """Wrong password, unknown user, unknown CA, hostname mismatch, expired certificate.

    ``run`` used to retry a SASL failure forever; each command now exits 2
    within 10 s with one line naming Kafka and the reason, never the password.
    """
    names = secured_kafka.names("pod")
    env, reason = _refusal_cases(secured_kafka)[case]
    env = env | pod_env | {"LEASEWORKER_GROUP": names.group, "LW_TEST_TOPIC": names.topic}
    argv = {
        "run": ["run", "tests.jobs:MarkerJob"],
        "trigger": ["trigger", names.topic, "--payload", "{}"],
        "topics": ["topics", "create", f"{names.topic}-new"],
    }[command]
    result, took = _cli(argv, env)
    line = _refused_line(result, took, secured_kafka.passwords["pod"])
    assert "Kafka at" in line
    assert reason in line


@pytest.mark.parametrize(
    ("user", "lacking", "named"),
    [
        ("nodl", {"dead_letters": False}, "not authorized to describe topic 'dead-"),
        ("nogroup", {"group": False}, "not authorized to read consumer group 'group-"),
        ("noread", {"read_topic": False}, "not authorized: triggers-"),
    ],
    ids=["no dead-letter acl", "no group acl", "describe but no read on the job topic"],
)
def test_a_pod_lacking_one_acl_exits_2_naming_it_over_sasl_ssl(
    secured_kafka: SecuredKafka,
    pod_env: dict[str, str],
    user: str,
    lacking: dict[str, bool],
    named: str,
) -> None:
    """The pod ACLs less the dead-letter topic's, the group's, or Read on the job topic.

    The first two are found by the start-up check; the third only when the
    consumer fetches (metadata shows a topic one may describe): the poll loop
    then ends the pod the same way instead of retrying.
    """
    names = secured_kafka.names(user, **lacking)
    env = secured_kafka.env(user=user) | pod_env
    env |= {
        "LEASEWORKER_GROUP": names.group,
        "LEASEWORKER_DEAD_LETTER_TOPIC": names.dead_letters,
        "LW_TEST_TOPIC": names.topic,
    }
    result, took = _cli(["run", "tests.jobs:MarkerJob"], env)
    line = _refused_line(result, took, secured_kafka.passwords[user])
    assert named in line


async def test_a_sasl_ssl_broker_that_is_not_there_is_waited_for(
    secured_kafka: SecuredKafka, pod_env: dict[str, str], pods: list[PodProcess], tmp_path: Path
) -> None:
    """Nothing listening: the pod keeps retrying with a warning per attempt (no exit 2)."""
    env = secured_kafka.env(LEASEWORKER_BOOTSTRAP_SERVERS=f"127.0.0.1:{free_port()}") | pod_env
    env |= {"LEASEWORKER_GROUP": "group-absent", "LW_TEST_TOPIC": "absent"}
    pod = spawn_pod("waiting-pod", tmp_path, env)
    pods.append(pod)

    async def warned_twice() -> bool:
        return pod.log_text().count("unavailable for the") >= 2

    await eventually(warned_twice, within=30)
    assert pod.process.poll() is None, pod.log_text()[-2000:]


def test_the_sasl_password_file_is_read_again_for_every_new_client(
    secured_kafka: SecuredKafka, tmp_path: Path
) -> None:
    """A rotated password file is what the next client (a reconnect) authenticates with."""
    secret = tmp_path / "password"
    secret.write_text("old-password\n")
    security = KafkaSecurity(
        protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="pod",
        sasl_password_file=str(secret),
        ssl_cafile=str(secured_kafka.ca.ca_file),
    )
    assert security.client_kwargs()["sasl_plain_password"] == "old-password"
    secret.write_text(secured_kafka.passwords["pod"])
    assert security.client_kwargs()["sasl_plain_password"] == secured_kafka.passwords["pod"]
    assert secured_kafka.passwords["pod"] not in repr(security)


def test_trigger_from_a_principal_without_write_exits_2_naming_it_over_sasl_ssl(
    secured_kafka: SecuredKafka,
) -> None:
    """The pod's principal may read its job topic, not write it: ``trigger`` says so."""
    names = secured_kafka.names("pod")
    result, took = _cli(["trigger", names.topic, "--payload", "{}"], secured_kafka.env())
    line = _refused_line(result, took, secured_kafka.passwords["pod"])
    assert f"not authorized: {names.topic}" in line


async def test_the_testing_kit_pod_runs_through_sasl_ssl(
    secured_kafka: SecuredKafka, redis_server: LocalRedis
) -> None:
    """``leaseworker_pod``'s factory with ``kafka_security``: its pod and its sends use it."""
    names = secured_kafka.names("admin")  # sends need Write on the job topic: a super user
    security = KafkaSecurity(
        protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="admin",
        sasl_password=secured_kafka.passwords["admin"],
        ssl_cafile=str(secured_kafka.ca.ca_file),
    )
    factory = PodFactory(secured_kafka.broker, redis_server, names.topic)
    config = {
        "bootstrap_servers": secured_kafka.broker.address("SASL_SSL"),
        "kafka_security": security,
        "dead_letter_topic": names.dead_letters,
    }
    async with factory(MarkerJob, config=config) as pod:
        result = await pod.send({"jobId": "kit-1"}, within=60)
    assert result.outcome == "completed"


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_no_sasl_password_in_debug_output_of_run_and_trigger(
    secured_kafka: SecuredKafka, pod_env: dict[str, str], mechanism: str
) -> None:
    """At DEBUG aiokafka logs each request it sends; the SASL one carries the password.

    ``plainpod`` authenticates (PLAIN) and then lacks every ACL, so both
    commands log a whole successful SASL exchange and then exit 2.
    """
    user = "plainpod" if mechanism == "PLAIN" else "nogroup"
    names = secured_kafka.names("nogroup", group=False)
    env = secured_kafka.env(user=user, LEASEWORKER_KAFKA_SASL_MECHANISM=mechanism) | pod_env
    env |= {"LEASEWORKER_GROUP": names.group, "LW_TEST_TOPIC": names.topic}
    for argv in (["run", "tests.jobs:MarkerJob"], ["trigger", names.topic, "--payload", "{}"]):
        result, _ = _cli(["--log-level", "DEBUG", *argv], env)
        assert result.returncode == 2, result.stderr[-2000:]
        assert "SaslAuthenticateRequest" in result.stderr  # the exchange was logged...
        assert secured_kafka.passwords[user] not in result.stderr + result.stdout  # ...redacted
