"""The Kafka SASL/TLS flags, shared by ``run`` and ``trigger``."""

from __future__ import annotations

import argparse

from .._kafka import KafkaSecurity
from ._common import Setting

KAFKA_SECURITY_SETTINGS = (
    Setting(
        flag="--kafka-security-protocol",
        default="PLAINTEXT",
        help="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
    ),
    Setting(flag="--kafka-sasl-mechanism", help="PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"),
    Setting(flag="--kafka-sasl-username", help="SASL username"),
    Setting(flag="--kafka-sasl-password", help="SASL password; prefer the env var"),
    Setting(flag="--kafka-ssl-cafile", help="CA bundle for the brokers; unset: system CAs"),
)
"""The Kafka SASL/TLS flags, passed through to aiokafka (see KafkaSecurity)."""


def add_kafka_security_flags(parser: argparse.ArgumentParser) -> None:
    """Add the flags of :data:`KAFKA_SECURITY_SETTINGS`."""
    for setting in KAFKA_SECURITY_SETTINGS:
        setting.add_to(parser)


def kafka_security_from(args: argparse.Namespace) -> KafkaSecurity:
    """Build the Kafka SASL/TLS settings from the flags of :func:`add_kafka_security_flags`."""
    return KafkaSecurity(
        protocol=args.kafka_security_protocol,
        sasl_mechanism=args.kafka_sasl_mechanism or None,
        sasl_username=args.kafka_sasl_username or None,
        sasl_password=args.kafka_sasl_password or None,
        ssl_cafile=args.kafka_ssl_cafile or None,
    )
