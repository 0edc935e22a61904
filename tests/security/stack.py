"""Every secured peer at once: what a pod needs to run through all of them, and its secrets.

:class:`SecuredStack` joins the session's peers (``conftest.py``): Kafka over
``SASL_SSL`` with SCRAM-SHA-512 as the ``pod`` principal (its ACLs only, plus
``Write`` on the topic its job publishes to), Redis over TLS as the
documented ACL user (one topology), PostgreSQL verify-full as the runtime
role, and an OTLP collector on HTTPS. Every credential is in a file, as a
mounted Secret would be; :meth:`SecuredStack.secrets` lists what must never
be shown (passwords, URLs with them, the private keys' PEM bodies).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from leaseworker_dev._services import PodProcess, pod_process
from leaseworker_dev._services._kafka_acls import Acl
from leaseworker_dev._services._tls import TLSFiles

from ..kafka_util import KafkaNames
from ..pods import REPO
from .cli import Ended, leaseworker
from .collector import Collector
from .conftest import OWNER, RUNTIME, SecurePostgres, SecureRedis
from .secured_kafka import SecuredKafka

JOB = "tests.security.jobs:OutboxJob"

CA_BUNDLE_VARIABLES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
"""requests lets these override the exporter's OTEL_EXPORTER_OTLP_CERTIFICATE: unset them."""


@dataclass(frozen=True)
class SecuredStack:
    """The secured peers a test's pod and commands use, and the test's topics."""

    kafka: SecuredKafka
    redis: SecureRedis
    postgres: SecurePostgres
    collector: Collector
    names: KafkaNames
    workdir: Path

    @property
    def ready_topic(self) -> str:
        """The topic the job publishes to through the outbox."""
        return f"{self.names.topic}.ready"

    def prepare(self) -> None:
        """Create the ready topic and let the pod's principal write it (the relay sends there)."""
        self.kafka.broker.create_topics([self.ready_topic])
        self.kafka.broker.grant([Acl("User:pod", "write", "topic", self.ready_topic)])

    def env(self) -> dict[str, str]:
        """The ``LEASEWORKER_*`` and ``OTEL_*`` variables of a pod (or a command) of the stack.

        Credentials come from files: the Redis URL (user and password; its TLS
        files from their own variables), the store URL, the SASL password.
        """
        kafka = self.kafka.env("SASL_SSL", user="pod")
        password = self._secret_file("kafka-password", kafka.pop("LEASEWORKER_KAFKA_SASL_PASSWORD"))
        tls = self.redis.tls
        return kafka | {
            "LEASEWORKER_KAFKA_SASL_PASSWORD_FILE": password,
            "LEASEWORKER_GROUP": self.names.group,
            "LEASEWORKER_DEAD_LETTER_TOPIC": self.names.dead_letters,
            "LEASEWORKER_REDIS_URL_FILE": self._secret_file(
                "redis-url", self.redis.url().partition("?")[0]
            ),
            "LEASEWORKER_REDIS_CA_FILE": str(tls.server.ca),
            "LEASEWORKER_REDIS_CERT_FILE": str(tls.client.cert),
            "LEASEWORKER_REDIS_KEY_FILE": str(tls.client.key),
            "LEASEWORKER_STORE_URL_FILE": self._secret_file(
                "store-url", self.postgres.url(RUNTIME)
            ),
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.collector.endpoint,
            "OTEL_EXPORTER_OTLP_CERTIFICATE": str(self.kafka.ca.ca_file),
            "OTEL_METRICS_EXPORTER": "otlp",
            "OTEL_METRIC_EXPORT_INTERVAL": "1000",
            "LW_TEST_TOPIC": self.names.topic,
            "LW_TEST_READY_TOPIC": self.ready_topic,
        }

    def producer_env(self) -> dict[str, str]:
        """``trigger``'s variables: SASL_SSL as ``admin`` (the pod may not write its job topic)."""
        return self.kafka.env("SASL_SSL", user="admin") | {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.collector.endpoint,
            "OTEL_EXPORTER_OTLP_CERTIFICATE": str(self.kafka.ca.ca_file),
        }

    def secrets(self) -> list[str]:
        """Every value that must not appear in any output: passwords, URLs, PEM key bodies."""
        found = [
            *self.kafka.passwords.values(),
            self.redis.password,
            self.redis.url(),
            self.postgres.passwords[RUNTIME],
            self.postgres.passwords[OWNER],
            self.postgres.url(RUNTIME),
            self.postgres.url(OWNER),
        ]
        keys = [self.redis.tls.client, self.redis.tls.server, self.kafka.client]
        for identity in keys:
            found += pem_body_lines(identity)
        return found

    def _secret_file(self, name: str, value: str) -> str:
        path = self.workdir / name
        path.write_text(value + "\n")
        path.chmod(0o600)
        return str(path)


def pem_body_lines(identity: TLSFiles) -> list[str]:
    """The base64 lines of ``identity``'s private key (any one of them shown is a leak)."""
    text = identity.key.read_text()
    return [line for line in text.splitlines() if re.fullmatch(r"[A-Za-z0-9+/=]{16,}", line)]


def start_pod(stack: SecuredStack, name: str, *flags: str, log_level: str = "INFO") -> PodProcess:
    """Start ``leaseworker run`` of the stack's job as ``name``, CA-bundle variables unset."""
    pod = pod_process(
        name,
        JOB,
        workdir=stack.workdir,
        flags=flags,
        env={**stack.env(), "LEASEWORKER_POD": name, "OTEL_SERVICE_NAME": f"secured-{name}"},
        cwd=REPO,
        log_level=log_level,
    )
    for variable in CA_BUNDLE_VARIABLES:
        pod.env.pop(variable, None)
    return pod.start()


def command(*argv: str, env: dict[str, str]) -> Ended:
    """Run a ``leaseworker`` command with ``env`` (CA-bundle variables emptied: not set)."""
    return leaseworker(*argv, env=env | dict.fromkeys(CA_BUNDLE_VARIABLES, ""))
