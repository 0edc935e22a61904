"""``KafkaSecurity``: how the pod's Kafka clients authenticate and encrypt.

The settings pass straight through to aiokafka (``security_protocol``,
``sasl_mechanism``, ``sasl_plain_username``/``sasl_plain_password``, and an
``ssl_context`` built from a CA file); the CLI fills them from
``LEASEWORKER_KAFKA_*`` environment variables. The password never appears in
a repr, and so never in a log line that prints the config.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from aiokafka.helpers import create_ssl_context  # type: ignore[import-untyped]

from .._errors import ConfigError

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
    brokers against ``ssl_cafile``, or the system's CAs when it is unset.
    Inconsistent settings raise :class:`~leaseworker.ConfigError`.
    """

    protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    ssl_cafile: str | None = None

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"kafka security protocol must be one of {PROTOCOLS}")
        if self.sasl:
            self._check_sasl()
        elif self.sasl_mechanism or self.sasl_username or self.sasl_password:
            raise ConfigError(
                f"SASL settings are given but the kafka security protocol is {self.protocol}; "
                "use SASL_SSL (or SASL_PLAINTEXT)"
            )
        if self.ssl_cafile is not None:
            if not self.tls:
                raise ConfigError(
                    f"a Kafka CA file is given but the protocol is {self.protocol}; use SSL or "
                    "SASL_SSL"
                )
            if not os.path.isfile(self.ssl_cafile):
                raise ConfigError(f"Kafka CA file not found: {self.ssl_cafile}")

    def _check_sasl(self) -> None:
        if self.mechanism not in SASL_MECHANISMS:
            raise ConfigError(f"kafka SASL mechanism must be one of {SASL_MECHANISMS}")
        if not self.sasl_username or not self.sasl_password:
            raise ConfigError(f"{self.protocol} needs a SASL username and password")

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
            kwargs["ssl_context"] = create_ssl_context(cafile=self.ssl_cafile)
        if self.sasl:
            kwargs["sasl_mechanism"] = self.mechanism
            kwargs["sasl_plain_username"] = self.sasl_username
            kwargs["sasl_plain_password"] = self.sasl_password
        return kwargs

    def __repr__(self) -> str:
        password = None if self.sasl_password is None else "***"
        return (
            f"KafkaSecurity(protocol={self.protocol!r}, sasl_mechanism={self.sasl_mechanism!r}, "
            f"sasl_username={self.sasl_username!r}, sasl_password={password!r}, "
            f"ssl_cafile={self.ssl_cafile!r})"
        )
