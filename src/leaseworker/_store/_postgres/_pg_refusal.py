"""Tell a PostgreSQL that refuses the pod from one that is merely not up, in any language.

psycopg reports a failed connection attempt with libpq's text and no SQLSTATE,
and the server words its refusal in its own ``lc_messages``. So the text is
never parsed. Instead:

- libpq's ``PQping`` on the same URL answers "OK" when the server took part in
  the attempt and sent an error other than "cannot connect now": it refused
  the role, the password, the database or the address (SQLSTATE 28P01, 28000,
  3D000, 42501): permanent, once a second connection attempt made after the
  ping fails as well. The ping comes after the failure: a server that was
  unreachable for a moment (a store outage healing as the pod starts) answers
  it too, and the second attempt then connects, so that is waited for, not
  refused.
  A multi-host URL asking for a writable server (``target_session_attrs``)
  while none is (the primary dead, its standby not yet promoted) fails both
  attempts on the standby: one more attempt that takes any server tells
  it from a refusal, and is waited for when it connects.
- The server asked for a password and the URL has none: permanent.
- Otherwise the server did not answer, or the TLS handshake failed. When the
  URL asks for TLS, the handshake is tried again with Python's ``ssl`` (the
  PostgreSQL ``SSLRequest`` first): an unknown CA, a name mismatch, an expired
  certificate or a server without TLS is permanent, with OpenSSL's reason.

Anything else is worth waiting for. The one refusal this cannot tell from a
permanent one is "too many connections" (53300), which also comes after the
password: it exits 2 as well, and the pod's restart retries it.
"""

from __future__ import annotations

import socket
import ssl
import struct
from pathlib import Path
from typing import Any

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..._errors import ConfigError
from .._url import StoreURL

_SSL_REQUEST = struct.pack("!ii", 8, 80877103)
"""The message asking a PostgreSQL server to switch to TLS (protocol 3, "SSLRequest")."""

_TLS_MODES = ("require", "verify-ca", "verify-full")


def refusal(url: StoreURL, exc: psycopg.OperationalError, *, timeout: float) -> ConfigError | None:
    """Return the permanent reason ``exc`` ended a connection attempt, or ``None`` (wait).

    Blocking (``PQping``, a TLS handshake): call it from a worker thread.
    ``timeout`` bounds each of the two probes.
    """
    where = f"completion store at {url.redacted}"
    pgconn = exc.pgconn
    if pgconn is not None and pgconn.needs_password and not pgconn.used_password:
        return ConfigError(f"{where}: the server asks for a password and the URL has none")
    bounded = make_conninfo(url.target, connect_timeout=max(2, round(timeout)))
    answer = pq.PGconn.ping(bounded.encode())
    if answer == pq.Ping.OK:
        if _connects(bounded):
            return None  # the server was not there for the first attempt; it is now
        if _wants_writes(url.target) and _connects(
            make_conninfo(bounded, target_session_attrs="any")
        ):
            return None  # the credentials work; no server takes writes yet (a promotion)
        said = "after the password" if pgconn is not None and pgconn.used_password else "at once"
        return ConfigError(f"{where} refused the connection {said}: {_server_words(exc)}")
    if answer == pq.Ping.NO_ATTEMPT:
        return ConfigError(f"{where}: libpq cannot use the URL's parameters")
    if answer == pq.Ping.NO_RESPONSE:
        return _tls_refusal(where, conninfo_to_dict(url.target), timeout=timeout)
    return None  # REJECT: starting up or shutting down


def _wants_writes(conninfo: str) -> bool:
    """Whether ``conninfo`` asks libpq for a particular kind of server (a writable one)."""
    return str(conninfo_to_dict(conninfo).get("target_session_attrs") or "any") != "any"


def _connects(conninfo: str) -> bool:
    """Whether one blocking libpq connection to ``conninfo`` succeeds (closed at once)."""
    pgconn = pq.PGconn.connect(conninfo.encode())
    try:
        return pgconn.status == pq.ConnStatus.OK
    finally:
        pgconn.finish()


def _server_words(exc: psycopg.OperationalError) -> str:
    """Return the server's own line from libpq's message (never holds the password)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.rpartition(" failed: ")[2] or text


def _tls_refusal(where: str, params: dict[str, Any], *, timeout: float) -> ConfigError | None:
    """Handshake as libpq would for ``params``; return why the server's TLS is unusable."""
    mode = str(params.get("sslmode", "prefer"))
    if mode not in _TLS_MODES:
        return None
    host = str(params.get("host") or "localhost").split(",")[0]
    address = str(params.get("hostaddr") or host).split(",")[0]
    port = int(str(params.get("port") or 5432).split(",")[0])
    try:
        context = _context(mode, params)
    except (OSError, ssl.SSLError) as exc:
        return ConfigError(f"{where}: cannot load the TLS files of the URL ({exc.strerror or exc})")
    try:
        with socket.create_connection((address, port), timeout=timeout) as sock:
            sock.sendall(_SSL_REQUEST)
            if sock.recv(1) != b"S":
                return ConfigError(f"{where}: the server does not offer TLS (sslmode={mode})")
            with context.wrap_socket(sock, server_hostname=host):
                return None  # the handshake works: the failure was something else
    except ssl.SSLCertVerificationError as exc:
        return ConfigError(f"{where}: TLS certificate refused: {exc.verify_message}")
    except ssl.SSLError as exc:
        return ConfigError(f"{where}: TLS handshake failed: {exc.reason or exc}")
    except OSError:
        return None  # not reachable: down, or not up yet


def _context(mode: str, params: dict[str, Any]) -> ssl.SSLContext:
    """Build the ``ssl`` context that libpq's sslmode, sslrootcert, sslcert and sslkey ask for."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if mode == "require":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context.check_hostname = mode == "verify-full"
        root = params.get("sslrootcert") or Path.home() / ".postgresql" / "root.crt"
        if root == "system":
            context.load_default_certs()
        else:
            context.load_verify_locations(cafile=str(root))
    if params.get("sslcert"):
        context.load_cert_chain(str(params["sslcert"]), params.get("sslkey") or None)
    return context
