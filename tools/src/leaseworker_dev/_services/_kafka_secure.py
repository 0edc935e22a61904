"""The secured listeners of the local Kafka broker: TLS, SASL users and the authorizer.

A :class:`BrokerSecurity` given to ``LocalKafka.start`` adds, next to the
broker's own ``PLAINTEXT`` listener (inter-broker traffic, the controller and
the tests' admin calls), an ``SSL`` listener (a client certificate is
required when ``client_auth``), a ``SASL_SSL`` listener with ``PLAIN`` users
(in the listener's JAAS settings) and ``SCRAM-SHA-256``/``SCRAM-SHA-512``
users (written into the metadata log when the storage is formatted: KRaft
has no other store before the broker runs), and more ``SSL`` listeners with
certificates of their own (one issued for another host, one expired) so that
every refusal a client can meet has a real peer. With ``reauth_ms``, a second
``SASL_SSL`` listener (``SASL_REAUTH``) ends each session after that long
(``connections.max.reauth.ms``): a client that does not re-authenticate, as
aiokafka does not, is disconnected and must log in again (a rotated password's
test). With ``authorizer``, KRaft's
``StandardAuthorizer`` denies what no ACL allows; the ``PLAINTEXT``
listener's ``ANONYMOUS`` principal is a super user, as the broker itself
talks through it.

Certificates and keys are PEM files (``ssl.keystore.type=PEM``): a keystore
holds the broker's PKCS#8 key and its certificate chain. Passwords end up in
``server.properties`` inside JAAS strings, so they must not contain quotes,
backslashes or semicolons (test passwords are random hex).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

SSL_LISTENER = "SSL"
"""The listener with the broker's good certificate (client certificates when asked)."""

SASL_LISTENER = "SASL_SSL"
"""The listener that authenticates with SASL over TLS (PLAIN and SCRAM users)."""

REAUTH_LISTENER = "SASL_REAUTH"
"""The ``SASL_SSL`` listener whose sessions end after ``BrokerSecurity.reauth_ms``."""

SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
"""Every SCRAM user gets a credential for each of these."""

AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
"""KRaft's authorizer: ACLs live in the metadata log."""

PRINCIPAL_FROM_CN = "RULE:^CN=([^,]+)(,.*)?$/$1/,DEFAULT"
"""A client certificate's principal is its common name (``User:pod``, not the whole DN)."""

_PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
_SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"


@dataclass(frozen=True, slots=True, kw_only=True, repr=False)
class BrokerSecurity:
    """The secured listeners a ``LocalKafka`` opens besides its ``PLAINTEXT`` one.

    ``keystore``: the broker's PEM key and certificate chain for the ``SSL``
    and ``SASL_SSL`` listeners. ``truststore``: the CA (PEM) client
    certificates must chain to; ``client_auth`` makes the ``SSL`` listener
    require one. ``plain_users``/``scram_users``: name to password.
    ``authorizer``: deny what no ACL allows (``super_users`` bypass ACLs).
    ``more_listeners``: listener name to another keystore, each an ``SSL``
    listener (a certificate for the wrong host, an expired one). ``reauth_ms``:
    open :data:`REAUTH_LISTENER`, its sessions that long (0: no such listener).
    """

    keystore: Path
    truststore: Path | None = None
    client_auth: bool = False
    plain_users: Mapping[str, str] = field(default_factory=dict)
    scram_users: Mapping[str, str] = field(default_factory=dict)
    authorizer: bool = False
    super_users: tuple[str, ...] = ()
    more_listeners: Mapping[str, Path] = field(default_factory=dict)
    reauth_ms: int = 0

    def __post_init__(self) -> None:
        for name in self.more_listeners:
            if not name.isupper() or name in (*self.sasl_listeners, SSL_LISTENER, "PLAINTEXT"):
                raise ValueError(f"listener name must be a new upper-case name, got {name!r}")
        if self.client_auth and self.truststore is None:
            raise ValueError("client_auth needs a truststore to verify client certificates")

    @property
    def listeners(self) -> tuple[str, ...]:
        """The secured listeners' names, each of which gets a port."""
        return (SSL_LISTENER, *self.sasl_listeners, *self.more_listeners)

    @property
    def sasl_listeners(self) -> tuple[str, ...]:
        """The ``SASL_SSL`` listeners: :data:`SASL_LISTENER`, and the re-authenticating one."""
        return (SASL_LISTENER, REAUTH_LISTENER) if self.reauth_ms > 0 else (SASL_LISTENER,)

    def protocol(self, listener: str) -> str:
        """Return the security protocol of one of :attr:`listeners`."""
        return "SASL_SSL" if listener in self.sasl_listeners else "SSL"

    def __repr__(self) -> str:
        # Names only: the passwords stay out of reprs and so out of test reports.
        return (
            f"BrokerSecurity(listeners={self.listeners}, client_auth={self.client_auth}, "
            f"plain_users={sorted(self.plain_users)}, scram_users={sorted(self.scram_users)}, "
            f"authorizer={self.authorizer})"
        )


def broker_settings(security: BrokerSecurity) -> dict[str, str]:
    """Return the ``server.properties`` lines of the secured listeners (not their addresses)."""
    settings = {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(security.keystore),
        "ssl.principal.mapping.rules": PRINCIPAL_FROM_CN,
    }
    if security.truststore is not None:
        settings["ssl.truststore.type"] = "PEM"
        settings["ssl.truststore.location"] = str(security.truststore)
    if security.client_auth:
        settings[f"listener.name.{SSL_LISTENER.lower()}.ssl.client.auth"] = "required"
    for name, keystore in security.more_listeners.items():
        settings[f"listener.name.{name.lower()}.ssl.keystore.type"] = "PEM"
        settings[f"listener.name.{name.lower()}.ssl.keystore.location"] = str(keystore)
    settings.update(_sasl_settings(security))
    if security.authorizer:
        settings["authorizer.class.name"] = AUTHORIZER
        principals = ["User:ANONYMOUS", *(f"User:{name}" for name in security.super_users)]
        settings["super.users"] = ";".join(principals)
    return settings


def _sasl_settings(security: BrokerSecurity) -> dict[str, str]:
    """Return the ``SASL_SSL`` listeners' mechanisms, JAAS settings and session lifetimes."""
    users = " ".join(f'user_{name}="{pw}"' for name, pw in security.plain_users.items())
    settings = {}
    for listener in security.sasl_listeners:
        prefix = f"listener.name.{listener.lower()}"
        plain = f"{_PLAIN_MODULE} required {users};".replace("  ", " ")
        scram = f"{_SCRAM_MODULE} required;"
        settings[f"{prefix}.sasl.enabled.mechanisms"] = ",".join(("PLAIN", *SCRAM_MECHANISMS))
        settings[f"{prefix}.plain.sasl.jaas.config"] = plain
        for mechanism in SCRAM_MECHANISMS:
            settings[f"{prefix}.{mechanism.lower()}.sasl.jaas.config"] = scram
        if listener == REAUTH_LISTENER:
            for mechanism in ("PLAIN", *SCRAM_MECHANISMS):
                reauth = f"{prefix}.{mechanism.lower()}.connections.max.reauth.ms"
                settings[reauth] = str(security.reauth_ms)
    return settings


def scram_format_args(security: BrokerSecurity | None) -> list[str]:
    """Return ``kafka-storage format`` arguments that create the SCRAM users (KIP-900)."""
    if security is None:
        return []
    args: list[str] = []
    for name, password in security.scram_users.items():
        for mechanism in SCRAM_MECHANISMS:
            args += ["--add-scram", f"{mechanism}=[name={name},password={password}]"]
    return args
