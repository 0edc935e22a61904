"""The Kafka SASL/TLS flags, shared by ``run`` and ``trigger``."""

from __future__ import annotations

import argparse

from .._kafka import KafkaSecurity
from ._common import flag


def add_kafka_security_flags(parser: argparse.ArgumentParser) -> None:
    """Add the Kafka SASL/TLS flags, passed through to aiokafka (see KafkaSecurity)."""
    flag(
        parser,
        "--kafka-security-protocol",
        "PLAINTEXT",
        "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
    )
    flag(parser, "--kafka-sasl-mechanism", None, "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
    flag(parser, "--kafka-sasl-username", None, "SASL username")
    flag(parser, "--kafka-sasl-password", None, "SASL password; prefer the env var")
    flag(parser, "--kafka-ssl-cafile", None, "CA bundle for the brokers; unset: system CAs")


def kafka_security_from(args: argparse.Namespace) -> KafkaSecurity:
    """Build the Kafka SASL/TLS settings from the flags of :func:`add_kafka_security_flags`."""
    return KafkaSecurity(
        protocol=args.kafka_security_protocol,
        sasl_mechanism=args.kafka_sasl_mechanism or None,
        sasl_username=args.kafka_sasl_username or None,
        sasl_password=args.kafka_sasl_password or None,
        ssl_cafile=args.kafka_ssl_cafile or None,
    )
