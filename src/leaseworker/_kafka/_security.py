"""``KafkaSecurity``: how the pod's Kafka clients authenticate and encrypt.

The settings pass straight through to aiokafka (``security_protocol``,
``sasl_mechanism``, ``sasl_plain_username``/``sasl_plain_password``, and an
``ssl_context`` built from a CA file and, for mutual TLS, a client
certificate and key); the CLI fills them from ``--kafka-*`` flags and
``LEASEWORKER_KAFKA_*`` environment variables. The password never appears in
a repr, and so never in a log line that prints the config, nor in the
SASL request aiokafka logs at DEBUG (redacted by a filter on its logger).
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka.helpers import create_ssl_context  # type: ignore[import-untyped]

from .._errors import ConfigError
from .._secrets import SecretFile

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
"""Kafka security protocols aiokafka speaks."""

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
"""SASL mechanisms that work with a username and password."""


@dataclass(frozen=True, slots=True, kw_only=True, repr=False)
class KafkaSecurity:
    """Security settings of the Kafka consumer and dead-letter producer.

    ::

        KafkaSecurity(protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                      sasl_username="reports", sasl_password=os.environ["KAFKA_PASSWORD"],
                      ssl_cafile="/etc/leaseworker/kafka-ca.crt")

    ``protocol`` is one of :data:`PROTOCOLS`. SASL protocols need a mechanism
    (default ``PLAIN``), a username and a password; TLS protocols verify the
    brokers against ``ssl_cafile``, or the system's CAs when it is unset, and
    present ``ssl_certfile`` (PEM, chain first) with its unencrypted key
    ``ssl_keyfile`` when the brokers ask for a client certificate.
    Inconsistent settings, a missing file or a key that does not match the
    certificate raise :class:`~leaseworker.ConfigError`. ``sasl_password_file``
    instead of ``sasl_password``: the file is read again for every new client
    (start and each start-up retry) and when a broker refuses a running
    client's login (``_logins``): a new password there rebuilds the pod's
    clients, so a rotated Kubernetes Secret is picked up without a restart.
    """

    protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    sasl_password_file: str | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"kafka security protocol must be one of {PROTOCOLS}")
        if self.sasl:
            self._check_sasl()
        elif self.sasl_mechanism or self.sasl_username or self.sasl_password or self.password_file:
            raise ConfigError(
                f"SASL settings are given but the kafka security protocol is {self.protocol}; "
                "use SASL_SSL (or SASL_PLAINTEXT)"
            )
        self._check_files()

    def _check_files(self) -> None:
        files = {"CA": self.ssl_cafile, "certificate": self.ssl_certfile, "key": self.ssl_keyfile}
        for what, path in files.items():
            if path is None:
                continue
            if not self.tls:
                raise ConfigError(
                    f"a Kafka {what} file is given but the protocol is {self.protocol}; use SSL "
                    "or SASL_SSL"
                )
            if not os.path.isfile(path):
                raise ConfigError(f"Kafka {what} file not found: {path}")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ConfigError("a Kafka client certificate needs its key file, and a key its cert")
        if self.tls:
            self.ssl_context()  # a certificate and key that do not load fail now, not per connect

    @property
    def password_file(self) -> str | None:
        """The file the SASL password is read from, if it comes from one."""
        return self.sasl_password_file

    def _check_sasl(self) -> None:
        if self.mechanism not in SASL_MECHANISMS:
            raise ConfigError(f"kafka SASL mechanism must be one of {SASL_MECHANISMS}")
        if self.sasl_password and self.sasl_password_file:
            raise ConfigError("give the Kafka SASL password or its file, not both")
        if not self.sasl_username or not (self.sasl_password or self.sasl_password_file):
            raise ConfigError(f"{self.protocol} needs a SASL username and password")
        self.password()  # an unreadable or empty file fails now

    def password(self) -> str | None:
        """Return the SASL password: as given, or read from its file now (stripped).

        The file is a :class:`~leaseworker._secrets.SecretFile`, the reader every
        credential file of the pod goes through (Redis and store URLs alike).
        """
        if self.sasl_password_file is None:
            return self.sasl_password
        return SecretFile(Path(self.sasl_password_file), "the Kafka SASL password file").read()

    @property
    def sasl(self) -> bool:
        """Whether the protocol authenticates with SASL."""
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        """Whether the protocol encrypts with TLS."""
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def mechanism(self) -> str:
        """The SASL mechanism (``PLAIN`` unless set)."""
        return self.sasl_mechanism or "PLAIN"

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``AIOKafkaConsumer``/``AIOKafkaProducer``."""
        kwargs: dict[str, Any] = {"security_protocol": self.protocol}
        if self.tls:
            kwargs["ssl_context"] = self.ssl_context()
        if self.sasl:
            _redact_sasl_requests()
            kwargs["sasl_mechanism"] = self.mechanism
            kwargs["sasl_plain_username"] = self.sasl_username
            kwargs["sasl_plain_password"] = self.password()
        return kwargs

    def ssl_context(self) -> ssl.SSLContext:
        """Return a new TLS context: the CA to verify brokers with, the client certificate.

        Raises ConfigError when a file does not load (not PEM, a key that is
        encrypted or belongs to another certificate), naming the file only.
        """
        try:
            context: ssl.SSLContext = create_ssl_context(
                cafile=self.ssl_cafile, certfile=self.ssl_certfile, keyfile=self.ssl_keyfile
            )
        except (ssl.SSLError, OSError) as exc:
            files = ", ".join(filter(None, (self.ssl_cafile, self.ssl_certfile, self.ssl_keyfile)))
            raise ConfigError(
                f"cannot load the Kafka TLS files ({files}): {getattr(exc, 'reason', None) or exc}"
            ) from None
        return context

    def __repr__(self) -> str:
        password = None if self.sasl_password is None else "***"
        return (
            f"KafkaSecurity(protocol={self.protocol!r}, sasl_mechanism={self.sasl_mechanism!r}, "
            f"sasl_username={self.sasl_username!r}, sasl_password={password!r}, "
            f"sasl_password_file={self.sasl_password_file!r}, "
            f"ssl_cafile={self.ssl_cafile!r}, ssl_certfile={self.ssl_certfile!r}, "
            f"ssl_keyfile={self.ssl_keyfile!r})"
        )


def _redacted_sasl_request(record: logging.LogRecord) -> bool:
    """Replace a SaslAuthenticate request in a log record's arguments by its name.

    aiokafka logs every request it sends at DEBUG, structure and all; for
    SASL that is the authentication bytes, which hold the PLAIN password.
    """
    if isinstance(record.args, tuple) and any(map(_is_sasl_request, record.args)):
        record.args = tuple(
            f"{type(arg).__name__}(<redacted>)" if _is_sasl_request(arg) else arg
            for arg in record.args
        )
    return True


def _is_sasl_request(arg: object) -> bool:
    return type(arg).__name__.startswith("SaslAuthenticateRequest")


def _redact_sasl_requests() -> None:
    """Install :func:`_redacted_sasl_request` on aiokafka's connection logger, once."""
    log = logging.getLogger("aiokafka.conn")
    if _redacted_sasl_request not in log.filters:
        log.addFilter(_redacted_sasl_request)
