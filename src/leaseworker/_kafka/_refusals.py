"""Telling a broker that refuses the pod from one that is away: refusals are settings.

A wrong SASL password or an unknown user, a broker certificate that does not
verify (unknown CA, another host's name, expired) and a missing ACL never
heal by retrying, unlike a broker that is down or starting. aiokafka's
bootstrap only logs why each broker failed and raises a bare
``KafkaConnectionError``; so when a client cannot start, :func:`check_refused`
opens one connection to each bootstrap broker itself, with the same settings,
and raises :class:`~leaseworker.ConfigError` naming Kafka and the reason when
a broker answered with a refusal. The password never appears in the message.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

import anyio
from aiokafka.conn import create_conn  # type: ignore[import-untyped]
from aiokafka.errors import (  # type: ignore[import-untyped]
    AuthenticationFailedError,
    AuthenticationMethodNotSupported,
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    IllegalSaslStateError,
    KafkaConnectionError,
    KafkaError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    UnsupportedSaslMechanismError,
)

from .._errors import ConfigError
from ._security import KafkaSecurity

AUTHENTICATION_ERRORS: tuple[type[BaseException], ...] = (
    SaslAuthenticationFailed,
    AuthenticationFailedError,
    AuthenticationMethodNotSupported,
    UnsupportedSaslMechanismError,
    IllegalSaslStateError,
)
"""What a broker answers to credentials it does not accept."""

AUTHORIZATION_ERRORS: tuple[type[BaseException], ...] = (
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    ClusterAuthorizationFailedError,
)
"""What a broker answers to a principal that lacks an ACL."""

PROBE_BOUND = 5.0
"""The longest one probe connection may take (a broker that hangs is not a refusal)."""


def refusal(exc: BaseException, security: KafkaSecurity) -> str | None:
    """Return why ``exc`` is a refusal that retrying cannot fix, or ``None``.

    The reason names the SASL user (never the password) or the TLS check that
    failed, as OpenSSL words it.
    """
    if isinstance(exc, AUTHENTICATION_ERRORS):
        user = f" for user {security.sasl_username!r}" if security.sasl_username else ""
        return f"SASL authentication failed{user} ({security.mechanism}): {_message(exc)}"
    if isinstance(exc, ssl.SSLCertVerificationError):
        reason = getattr(exc, "verify_message", None) or str(exc)
        return f"the broker's TLS certificate is not accepted: {reason}"
    if isinstance(exc, ssl.SSLError) and not _cut_short(exc):
        reason = (getattr(exc, "reason", None) or str(exc)).lower().replace("_", " ")
        if "alert" in reason:  # the broker ended the handshake: the client's certificate
            return f"the broker refused the client's TLS certificate ({reason})"
        return f"TLS failed ({reason}): is this listener TLS, and the protocol right?"
    if isinstance(exc, AUTHORIZATION_ERRORS):
        return f"not authorized: {_message(exc)}"
    return None


def _cut_short(exc: ssl.SSLError) -> bool:
    """Whether a TLS error is a connection cut mid-handshake (a broker going away)."""
    if isinstance(exc, ssl.SSLEOFError | ssl.SSLZeroReturnError | ssl.SSLSyscallError):
        return True
    return "EOF" in str(exc).upper()


def refused_error(
    bootstrap_servers: str, exc: BaseException, security: KafkaSecurity
) -> ConfigError | None:
    """Return the ConfigError for ``exc`` if it is a refusal (see :func:`refusal`), else None."""
    reason = refusal(exc, security)
    if reason is None:
        return None
    return ConfigError(f"Kafka at {bootstrap_servers} refused the connection: {reason}")


async def check_refused(
    bootstrap_servers: str, exc: BaseException, *, security: KafkaSecurity, within: float
) -> None:
    """Raise ConfigError if ``exc`` (a client's failed start) hides a broker's refusal.

    ``exc`` itself may be one (an authorization error); a bare
    ``KafkaConnectionError`` from the bootstrap is looked behind by
    connecting to each broker in turn, each try bounded by ``within`` (at
    most :data:`PROBE_BOUND`). Anything else (a broker down, hung, or
    answering) returns: the caller retries.
    """
    error = refused_error(bootstrap_servers, exc, security)
    if error is None and type(exc) is KafkaConnectionError:
        for host, port in _hosts(bootstrap_servers):
            cause = await _connect(host, port, security, min(within, PROBE_BOUND))
            if cause is not None:
                error = refused_error(bootstrap_servers, cause, security)
            if error is not None:
                break
    if error is not None:
        _quiet_dropped_tls_connections()
        raise error from exc


_UNRETRIEVED = "Future exception was never retrieved"


def _unretrieved_tls_error(record: logging.LogRecord) -> bool:
    """Drop asyncio's "Future exception was never retrieved" for a TLS error (keep the rest)."""
    error = record.exc_info[1] if record.exc_info else None
    return not (str(record.msg).startswith(_UNRETRIEVED) and isinstance(error, ssl.SSLError))


def _quiet_dropped_tls_connections() -> None:
    """Keep the refusal the last word: no traceback about the connection that was refused.

    aiokafka drops a connection whose TLS read failed (a broker refusing the
    client's certificate) with the error set on its stream's closed-future;
    when garbage collection reaches that future before its protocol, asyncio
    logs it with a traceback, after the one-line refusal. Installed once.
    """
    log = logging.getLogger("asyncio")
    if _unretrieved_tls_error not in log.filters:
        log.addFilter(_unretrieved_tls_error)


async def _connect(
    host: str, port: int, security: KafkaSecurity, within: float
) -> BaseException | None:
    """Open and close one connection as the clients would; return what failed, if anything."""
    kwargs: dict[str, Any] = security.client_kwargs()
    try:
        with anyio.fail_after(within):
            conn = await create_conn(
                host, port, request_timeout_ms=max(1, round(within * 1000)), **kwargs
            )
    except KafkaConnectionError as exc:
        # A broker that rejects the client's certificate (or its absence) says
        # so in a TLS alert after the handshake, which aiokafka reports as a
        # closed connection: read it on a plain TLS connection.
        return (await _tls_alert(host, port, security, within) if security.tls else None) or exc
    except (KafkaError, OSError, TimeoutError) as exc:
        return exc
    conn.close()
    return None


async def _tls_alert(
    host: str, port: int, security: KafkaSecurity, within: float
) -> ssl.SSLError | None:
    """Return the TLS error a broker answers a bare TLS connection with, if any.

    asyncio streams, as aiokafka's own connections (the Kafka layer runs on asyncio).
    """
    writer = None
    try:
        with anyio.fail_after(within):
            reader, writer = await asyncio.open_connection(
                host, port, ssl=security.ssl_context(), server_hostname=host
            )
            await reader.read(1)
    except ssl.SSLError as exc:
        return exc
    except (OSError, TimeoutError):
        return None
    finally:
        if writer is not None:
            writer.transport.abort()  # no TLS goodbye: the broker has said its word
    return None


def _hosts(bootstrap_servers: str) -> list[tuple[str, int]]:
    """Split ``host:port[,...]`` (a missing port is Kafka's 9092; ``[v6]:port`` too)."""
    hosts = []
    for entry in filter(None, (part.strip() for part in bootstrap_servers.split(","))):
        host, _, port = entry.rpartition(":")
        if not host or not port.isdigit():
            host, port = entry, "9092"
        hosts.append((host.strip("[]"), int(port)))
    return hosts


def _message(exc: BaseException) -> str:
    """Return the broker's own words of a Kafka error (its first argument), or its type."""
    if isinstance(exc, KafkaError) and exc.args:
        return str(exc.args[0])
    return type(exc).__name__
