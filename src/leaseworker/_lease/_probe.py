"""What a pod checks in Redis at start, so that settings that cannot work exit 2 at once.

- :func:`redis_refusal`: a connection error that waiting cannot heal: a certificate
  the client refuses (unknown CA, another host's name, expired), a TLS
  handshake the server refuses (no or an unknown client certificate).
- :func:`start_refusal`: which failed start-up PING is permanent (exit 2).
- :func:`tls_refusal`: the same asked of a handshake of its own, for a
  connection error that does not say: under TLS 1.3 a server asking for a
  client certificate refuses after the client's handshake ended, and redis-py,
  already writing its first command, often reads only the reset.
- :func:`ping_redis`: a PING that needs only ``+ping`` on every topology.
- :func:`check_redis`, once Redis answered: a plain ``redis://`` URL that
  points at a Redis Cluster node (it would serve the keys of that node's
  slots and answer ``MOVED`` for the others, forever), and the commands the
  lease scripts run, tried on a probe lease (an ACL that lacks one answers
  ``NOPERM``).
"""

from __future__ import annotations

import functools
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import anyio
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    MovedError,
    NoPermissionError,
    RedisClusterException,
    RedisError,
    ResponseError,
)

from .._errors import ConfigError, LeaseLost, LeaseUnavailable
from ._redis_clients import RedisTarget
from ._redis_leases import RedisLeases

PROBE_KEY = "leaseworker-startup-probe"
"""The job key of the lease every pod takes and releases at start (one key, whatever the pods)."""

_DENIALS = ("NOPERM", "no permissions", "can't run this command")
"""How Redis words an ACL refusal: of a command, or of a command inside a script."""

_SPREAD = 16
"""Keys in as many slot ranges tried for ``MOVED``: some is not on any one node of a cluster."""


def redis_refusal(exc: BaseException) -> str | None:
    """Return why a Redis connection error is permanent (a TLS refusal), or ``None``."""
    for cause in _chain(exc):
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"TLS certificate refused: {cause.verify_message}"
        if isinstance(cause, ssl.SSLError) and not isinstance(
            cause, ssl.SSLEOFError | ssl.SSLZeroReturnError
        ):
            return _handshake_refused(cause)
    return None


def _handshake_refused(exc: ssl.SSLError) -> str:
    reason = exc.reason or type(exc).__name__
    if "CERTIFICATE_REQUIRED" in reason:
        return (
            f"TLS handshake refused: {reason}: the server asks for a client certificate "
            "(--redis-cert-file and --redis-key-file, or the URL's ssl_certfile/ssl_keyfile)"
        )
    return f"TLS handshake refused: {reason}"


async def start_refusal(
    exc: BaseException, target: RedisTarget, *, where: str, bound: float
) -> ConfigError | None:
    """Return the exit-2 error for a failed start-up PING that waiting cannot heal, or ``None``.

    Refused credentials (``WRONGPASS``, unknown user), an ACL without the
    PING (``NOPERM``), a TLS refusal: the error's own, else a handshake of
    its own (:func:`tls_refusal`, in a thread; not after a timeout).
    """
    if isinstance(exc, AuthenticationError | AuthorizationError):
        return ConfigError(
            f"Redis at {where} refused the credentials in the Redis URL ({type(exc).__name__})"
        )
    if isinstance(exc, NoPermissionError):
        return _needs(where, _first_line(exc))
    refused = redis_refusal(exc)
    if refused is None and not isinstance(exc, TimeoutError):
        refused = await anyio.to_thread.run_sync(
            functools.partial(tls_refusal, target, timeout=bound)
        )
    return (
        None
        if refused is None
        else ConfigError(f"Redis at {where} refused the connection: {refused}")
    )


def tls_refusal(target: RedisTarget, *, timeout: float) -> str | None:
    """Handshake with the URL's first reachable host, sending nothing; return why TLS fails.

    ``None``: not TLS, not reachable (down or starting), or the handshake and
    the server's first word (none, within ``timeout``) are fine. Blocking: run
    it in a thread.
    """
    if not target.tls:
        return None
    files = target.tls_files
    try:
        context = ssl.create_default_context(cafile=files.get("ssl_ca_certs"))
        if files.get("ssl_certfile"):
            context.load_cert_chain(files["ssl_certfile"], files.get("ssl_keyfile"))
    except (OSError, ssl.SSLError) as exc:
        return f"cannot load the TLS files of the URL ({getattr(exc, 'strerror', None) or exc})"
    for host, port in target.hosts:
        try:
            with (
                socket.create_connection((host, port), timeout=timeout) as sock,
                context.wrap_socket(sock, server_hostname=host) as tls,
            ):
                tls.recv(1)  # a refused client certificate arrives as an alert here
        except ssl.SSLCertVerificationError as exc:
            return f"TLS certificate refused: {exc.verify_message}"
        except ssl.SSLError as exc:
            if isinstance(exc, ssl.SSLEOFError | ssl.SSLZeroReturnError):
                return None
            return _handshake_refused(exc)
        except TimeoutError:
            return None  # the handshake passed and the server waits for a command: fine
        except OSError:
            continue
        return None
    return None


async def ping_redis(client: Any, leases: RedisLeases | None) -> None:
    """PING Redis where the lease calls go: on a cluster, a primary through the leases' router.

    ``RedisCluster.ping`` would first ask for ``COMMAND``, which the pod's
    ACL does not allow (nor the lease calls need): it would read as
    ``NOPERM`` on every attempt.
    """
    if leases is not None and isinstance(client, RedisCluster):
        client = await leases._router_client(PROBE_KEY)
    await client.ping()


async def check_redis(
    client: Any, leases: RedisLeases, *, target: RedisTarget, where: str, bound: float
) -> None:
    """Raise :class:`ConfigError` if the URL's topology or the user's ACL cannot work.

    ``bound``: seconds each probe command may take. Other failures are left to
    the pod's normal handling (a Redis that goes away meanwhile is waited for
    when the pod first needs it).
    """
    if target.topology == "single":
        await _not_a_cluster_node(client, leases.namespace, where, bound)
    await _commands_allowed(client, leases, where, bound)


async def _not_a_cluster_node(client: Any, namespace: str, where: str, bound: float) -> None:
    for tag in _spread_tags():
        try:
            with anyio.fail_after(bound * 2):
                await client.get(f"{namespace}:{{{tag}}}:probe")
        except MovedError:
            raise ConfigError(
                f"Redis at {where} is a Redis Cluster node (it answered MOVED): use "
                "redis+cluster://host:port[,host:port...] (rediss+cluster:// for TLS)"
            ) from None
        except (RedisError, OSError, TimeoutError):
            return  # NOPERM is the next check's to name; an outage is not this check's


async def _commands_allowed(client: Any, leases: RedisLeases, where: str, bound: float) -> None:
    if leases.replicas:  # a refused WAIT reads as "0 replicas acknowledged": ask it alone
        try:
            with anyio.fail_after(bound * 2):
                await (await _node(client, leases)).execute_command("WAIT", 0, 0)
        except NoPermissionError as exc:
            raise _needs(where, _first_line(exc)) from None
        except (RedisError, RedisClusterException, OSError, TimeoutError):
            pass
    try:
        lease = await leases.acquire(PROBE_KEY, 5.0)
        if lease is None:
            return  # another pod is probing: its lease proves as much
        lease = await leases.renew(lease)
        await leases.release(lease)
    except (LeaseUnavailable, LeaseLost) as exc:
        denied = _denied(exc)
        if denied is None:
            return
        if "script" in denied:  # Redis does not say which of the script's commands
            node = await _node(client, leases)
            denied = await _denied_script_command(node, leases.namespace, bound) or denied
        raise _needs(where, denied) from None


async def _node(client: Any, leases: RedisLeases) -> Any:
    """Return the client for the probe key's node, as the leases reach it.

    On a cluster RedisCluster's own routing would first ask for ``COMMAND``,
    which the pod never needs (nor its ACL allows).
    """
    if isinstance(client, RedisCluster):
        return await leases._router_client(PROBE_KEY)
    return client


def _needs(where: str, denied: str) -> ConfigError:
    return ConfigError(f"Redis at {where} refused a command the pod needs (NOPERM): {denied}")


_SCRIPT_COMMANDS: dict[str, tuple[str, ...]] = {
    "GET": (),
    "SET": ("1", "PX", "1000"),
    "PTTL": (),
    "PEXPIRE": ("1000",),
    "DEL": (),
}
"""Each command the lease scripts run on a key, with the arguments a probe sends (and TIME)."""


async def _denied_script_command(node: Any, namespace: str, bound: float) -> str | None:
    """Send each command the scripts run, alone, on a probe key; return the first refusal."""
    key = f"{namespace}:{{{PROBE_KEY}}}:probe"
    commands = [(name, (key, *args)) for name, args in _SCRIPT_COMMANDS.items()]
    for name, args in [*commands, ("TIME", ())]:
        try:
            with anyio.fail_after(bound * 2):
                await node.execute_command(name, *args)
        except NoPermissionError as exc:
            return _first_line(exc)
        except (RedisError, OSError, TimeoutError):
            return None
    return None


def _denied(exc: BaseException) -> str | None:
    """Return Redis's first line for a permission refusal in ``exc``'s causes, or ``None``."""
    for cause in _chain(exc):
        text = _first_line(cause)
        if isinstance(cause, NoPermissionError) or (
            isinstance(cause, ResponseError) and any(sign in text for sign in _DENIALS)
        ):
            return text
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _spread_tags() -> list[str]:
    """Hash tags whose slots fall in :data:`_SPREAD` different ranges of the 16384 slots."""
    found: dict[int, str] = {}
    number = 0
    while len(found) < _SPREAD:
        tag = f"p{number}"
        found.setdefault(key_slot(tag.encode()) * _SPREAD // 16384, tag)
        number += 1
    return [found[index] for index in sorted(found)]
