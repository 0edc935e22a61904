"""The Kafka flags shared by the subcommands that talk to Kafka.

The SASL/TLS flags (``run``, ``trigger``, ``topics create``), and for the
one-shot commands (``trigger``, ``topics create``) ``--bootstrap-servers``
and the muting of aiokafka's own log lines. Files are
``--kafka-<what>-file`` and ``LEASEWORKER_KAFKA_<WHAT>_FILE``: the CA, the
client certificate and key (mutual TLS), the SASL password.
The CA's earlier spellings still work: ``--kafka-ssl-cafile``, a hidden
flag that warns once (a ``DeprecationWarning`` and a WARNING log line), and
``LEASEWORKER_KAFKA_SSL_CAFILE``, read when ``LEASEWORKER_KAFKA_CA_FILE`` is unset.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import TYPE_CHECKING

from .._deprecated import renamed
from .._errors import ConfigError
from ._common import Setting, config_default, env_default, env_name

if TYPE_CHECKING:
    from .._kafka import KafkaSecurity

KAFKA_SECURITY_SETTINGS = (
    Setting(
        flag="--kafka-security-protocol",
        default="PLAINTEXT",
        help="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
    ),
    Setting(flag="--kafka-sasl-mechanism", help="PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"),
    Setting(flag="--kafka-sasl-username", help="SASL username"),
    Setting(flag="--kafka-sasl-password", help="SASL password; prefer the file"),
    Setting(
        flag="--kafka-sasl-password-file",
        help="file holding the SASL password, read again for each new client",
    ),
    Setting(flag="--kafka-ca-file", help="CA bundle (PEM) for the brokers; unset: system CAs"),
    Setting(flag="--kafka-cert-file", help="client certificate (PEM) when brokers ask for one"),
    Setting(flag="--kafka-key-file", help="the client certificate's unencrypted key (PEM)"),
)
"""The Kafka SASL/TLS flags, passed through to aiokafka (see KafkaSecurity)."""

LEGACY_CA_VARIABLE = "LEASEWORKER_KAFKA_SSL_CAFILE"
"""The CA file's variable before ``LEASEWORKER_KAFKA_CA_FILE``; read when that is unset."""

LEGACY_CA_FLAG, CA_FLAG = "--kafka-ssl-cafile", "--kafka-ca-file"
"""The CA file's flag before ``--kafka-ca-file`` (a release ago), and its spelling now."""

logger = logging.getLogger("leaseworker.cli")


def add_kafka_security_flags(parser: argparse.ArgumentParser) -> None:
    """Add the flags of :data:`KAFKA_SECURITY_SETTINGS` and the CA's deprecated spelling."""
    for setting in KAFKA_SECURITY_SETTINGS:
        setting.add_to(parser)
    add_deprecated_kafka_flags(parser)


def add_deprecated_kafka_flags(parser: argparse.ArgumentParser) -> None:
    """Add ``--kafka-ssl-cafile``, hidden from ``--help``; :func:`kafka_security_from` reads it."""
    parser.add_argument(LEGACY_CA_FLAG, default=None, metavar="PATH", help=argparse.SUPPRESS)


def kafka_security_from(args: argparse.Namespace) -> KafkaSecurity:
    """Build the Kafka SASL/TLS settings from the flags of :func:`add_kafka_security_flags`."""
    from .._kafka import KafkaSecurity  # aiokafka: loaded by the commands that build one

    return KafkaSecurity(
        protocol=args.kafka_security_protocol,
        sasl_mechanism=args.kafka_sasl_mechanism or None,
        sasl_username=args.kafka_sasl_username or None,
        sasl_password=args.kafka_sasl_password or None,
        sasl_password_file=args.kafka_sasl_password_file or None,
        ssl_cafile=_ca_file(args),
        ssl_certfile=args.kafka_cert_file or None,
        ssl_keyfile=args.kafka_key_file or None,
    )


def _ca_file(args: argparse.Namespace) -> str | None:
    """Return the CA file: ``--kafka-ca-file``, its deprecated flag (warned of), or variable.

    The old flag wins over ``LEASEWORKER_KAFKA_CA_FILE`` (the command line over
    the environment); given with a different ``--kafka-ca-file``: ConfigError.
    """
    new: str | None = args.kafka_ca_file or None
    old: str | None = getattr(args, "kafka_ssl_cafile", None) or None
    if old is None:
        return new or os.environ.get(LEGACY_CA_VARIABLE) or None
    if new not in (None, old, env_default(CA_FLAG)):
        raise ConfigError(f"give {CA_FLAG} only ({LEGACY_CA_FLAG} is its deprecated spelling)")
    renamed(LEGACY_CA_FLAG, CA_FLAG)
    logger.warning("%s is deprecated; use %s", LEGACY_CA_FLAG, CA_FLAG)
    return old


def add_bootstrap_servers_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--bootstrap-servers`` (env and config default as for ``run``)."""
    parser.add_argument(
        "--bootstrap-servers",
        default=env_default("--bootstrap-servers", config_default("bootstrap_servers")),
        help=f"Kafka bootstrap servers (env {env_name('--bootstrap-servers')})",
    )


def mute_aiokafka_unless_debug(args: argparse.Namespace) -> None:
    """Silence aiokafka's loggers unless ``--log-level DEBUG`` was asked for.

    aiokafka logs each failed connection attempt; a one-shot command's one
    error line says what went wrong.
    """
    if args.log_level != "DEBUG":
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
