"""Nothing leaks: every output of a pod and of the CLI, at DEBUG, through every secured peer.

The pod runs through Kafka SASL_SSL (SCRAM), Redis TLS with the ACL user,
PostgreSQL verify-full and an HTTPS collector, with ``--log-job-errors`` and
one job that fails (its traceback is logged). Collected: the pod's log,
every span and metric export the collector got, ``/healthz``, ``/readyz``,
the Prometheus page, ``trigger``, ``topics create``, ``inspect
--show-result``, a refused ``run`` and every command's ``--help`` with the
secrets set as variables. None may hold a password, a URL with one, or a
line of a private key's PEM body. The check itself is shown to find a
planted leak of each kind.
"""

from __future__ import annotations

import signal
import urllib.request
import uuid
from collections.abc import Mapping

import pytest

from leaseworker._telemetry import names
from leaseworker_dev._services import PodProcess, free_port

from ..kafka_util import read_topic
from ..waiting import eventually
from .conftest import RUNTIME, SecureRedis
from .stack import SecuredStack, command, start_pod

HELP = (("run",), ("trigger",), ("inspect",), ("topics", "create"), ("timeline",), ("chaos",))
"""The commands whose ``--help`` is read with every secret in the environment."""


@pytest.fixture
def secured(redis_tls: SecureRedis) -> SecureRedis:
    """One TLS Redis (the end-to-end test covers Sentinel and Cluster)."""
    return redis_tls


def leaks(outputs: Mapping[str, str | bytes], secrets: list[str]) -> list[str]:
    """Return ``"<output>: <first characters of the secret>"`` for every secret found."""
    found = []
    for where, text in outputs.items():
        data = text.encode() if isinstance(text, str) else text
        for secret in secrets:
            if secret.encode() in data:
                found.append(f"{where}: {secret[:6]}...")
    return found


def test_the_leak_check_finds_a_planted_secret_of_each_kind(stack: SecuredStack) -> None:
    """A password, a URL with one, a PEM key line: each planted once, each found."""
    secrets = stack.secrets()
    key_line = next(line for line in secrets if len(line) >= 60)
    planted: dict[str, str | bytes] = {
        "log": f"connecting with {stack.postgres.passwords[RUNTIME]}\n",
        "span": b'{"attributes": "' + stack.redis.url().encode() + b'"}',
        "help": f"  --redis-key-file  default\n{key_line}\n",
        "clean": "nothing to see",
    }
    found = leaks(planted, secrets)
    assert {entry.partition(":")[0] for entry in found} == {"log", "span", "help"}


def _get(port: int | None, path: str) -> bytes:
    assert port is not None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return bytes(reply.read())
    except urllib.error.HTTPError as error:  # a 503 answer is an output too
        with error:
            return bytes(error.read())


async def test_no_secret_in_any_output_of_a_pod_or_the_cli_at_debug_sasl_ssl_tls(
    stack: SecuredStack, pods: list[PodProcess]
) -> None:
    """Logs, spans, metrics, health, inspect, trigger, topics, a traceback, a refusal, --help."""
    metrics_port = free_port()
    flags = ("--metrics-port", str(metrics_port), "--log-job-errors")
    pod = start_pod(stack, f"leak-{uuid.uuid4().hex[:6]}", *flags, log_level="DEBUG")
    pods.append(pod)
    good, bad = (f"report:leak:{uuid.uuid4().hex[:8]}:{n}" for n in ("ok", "fails"))
    outputs: dict[str, str | bytes] = {}
    producer = stack.producer_env() | {"LEASEWORKER_LOG_LEVEL": "DEBUG"}
    for key, body in ((good, "{}"), (bad, '{"fail": true}')):
        sent = command("trigger", stack.names.topic, "--key", key, "--payload", body, env=producer)
        assert sent.code == 0, sent.stderr
        outputs[f"trigger {key}"] = sent.stdout + sent.stderr

    await read_topic(stack.kafka.broker.bootstrap_servers, stack.ready_topic, 1, within=60)

    async def crashed_and_exported() -> bool:
        exported = names.SPAN_RUN in stack.collector.span_names()
        return (
            exported
            and "Traceback" in pod.log_text()
            and bool(stack.collector.bodies("/v1/metrics"))
        )

    await eventually(crashed_and_exported, within=30)
    outputs["/healthz"] = _get(pod.health_port, "/healthz")
    outputs["/readyz"] = _get(pod.health_port, "/readyz")
    outputs["/metrics"] = _get(metrics_port, "/metrics")
    assert b"leaseworker" in outputs["/metrics"]  # the page was served, not an error

    debug = stack.env() | {"LEASEWORKER_LOG_LEVEL": "DEBUG"}
    for key in (good, bad):
        shown = command("inspect", key, "--show-result", env=debug)
        assert shown.code == 0, shown.stderr
        outputs[f"inspect {key}"] = shown.stdout + shown.stderr
    topics = stack.producer_env() | {"LEASEWORKER_LOG_LEVEL": "DEBUG"}
    created = command("topics", "create", f"{stack.names.topic}.extra", env=topics)
    outputs["topics create"] = created.stdout + created.stderr
    wrong = stack.env() | {"LEASEWORKER_LOG_LEVEL": "DEBUG"}
    refused = command(
        "run",
        "tests.security.jobs:OutboxJob",
        "--redis-url",
        stack.redis.url(password="wrong-0a1b2c"),
        env={k: v for k, v in wrong.items() if k != "LEASEWORKER_REDIS_URL_FILE"},
    )
    assert refused.code == 2, refused.stderr[-2000:]
    outputs["refused run"] = refused.stdout + refused.stderr

    as_variables = stack.env() | {
        "LEASEWORKER_REDIS_URL": stack.redis.url(),
        "LEASEWORKER_STORE_URL": stack.postgres.url(RUNTIME),
        "LEASEWORKER_KAFKA_SASL_PASSWORD": stack.kafka.passwords["pod"],
    }
    for argv in HELP:
        helped = command(*argv, "--help", env=as_variables)
        assert helped.code == 0, helped.stderr
        outputs[f"{' '.join(argv)} --help"] = helped.stdout + helped.stderr

    pod.signal(signal.SIGTERM)
    assert await pod.wait_exit(30) == 0, pod.log_text()[-3000:]
    outputs["pod log"] = pod.log_text()
    outputs["collector"] = stack.collector.raw()
    assert "the job failed on purpose" in outputs["pod log"]  # --log-job-errors did log it
    assert leaks(outputs, [*stack.secrets(), "wrong-0a1b2c"]) == []
