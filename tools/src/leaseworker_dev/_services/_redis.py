"""A private ``redis-server`` on a free loopback port, without persistence (TLS if asked)."""

from __future__ import annotations

import shutil
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from ._clock import WallClock
from ._proc import HERE, LOOPBACK, LocalProcess, Place, free_port, service_workdir, wait_for_port
from ._shipped import ToolMissingError
from ._tls import ServiceTLS


@dataclass
class LocalRedis:
    """A running ``redis-server`` started from Debian's package.

    Persistence is off (as in many cache deployments), which is exactly what the
    fence-survival tests need: ``restart()`` brings the server back empty on the
    same port.
    """

    binary: str
    port: int
    workdir: Path
    process: LocalProcess
    remove_workdir: bool = field(default=False, repr=False)  # a temp dir of its own
    tls: ServiceTLS | None = None
    place: Place = HERE
    clock: WallClock | None = None

    @property
    def url(self) -> str:
        """The ``redis://`` URL clients connect to (``rediss://`` with the CA and client cert)."""
        if self.tls is None:
            return f"redis://{self.place.address}:{self.port}/0"
        return f"rediss://{self.place.address}:{self.port}/0?" + tls_query(self.tls)

    @classmethod
    def start(
        cls,
        *,
        port: int | None = None,
        workdir: Path | None = None,
        tls: ServiceTLS | None = None,
        place: Place = HERE,
        clock: WallClock | None = None,
    ) -> Self:
        """Start the server and wait until it accepts connections.

        ``tls``: serve TLS only (``port 0``, ``tls-port``), asking clients for a
        certificate if ``tls.auth_clients``. ``place``: run and listen there
        (a network namespace of ``Hosts``) instead of on this host's loopback.
        ``clock``: run on that wall clock, which the caller steps while it runs.
        """
        binary = shutil.which("redis-server")
        if binary is None:
            raise ToolMissingError(
                "redis-server is not installed; run scripts/bootstrap.sh "
                "(it installs Debian's redis-server package)"
            )
        port = port or free_port()
        with service_workdir(workdir, "redis") as (workdir, remove):
            process = _spawn(binary, port, workdir, tls, place, clock)
        return cls(
            binary=binary,
            port=port,
            workdir=workdir,
            process=process,
            remove_workdir=remove,
            tls=tls,
            place=place,
            clock=clock,
        )

    def restart_empty(self) -> None:
        """Stop the server and start it again on the same port with no data."""
        self.process.stop()
        (self.workdir / "dump.rdb").unlink(missing_ok=True)  # left by restart_with_data
        self.process = _spawn(
            self.binary, self.port, self.workdir, self.tls, self.place, self.clock
        )

    def restart_with_data(self) -> None:
        """Snapshot the data (``SAVE``), stop the server, start it again on it, same port.

        What a restart of a persistent Redis looks like to clients: connections
        drop, and the keys (leases with their remaining TTL, fence counters) are
        back once it answers again.
        """
        with socket.create_connection((self.place.address, self.port), timeout=10) as sock:
            sock.sendall(b"SAVE\r\n")
            if not sock.recv(64).startswith(b"+OK"):
                raise RuntimeError("redis-server refused SAVE")
        self.process.stop()
        self.process = _spawn(
            self.binary, self.port, self.workdir, self.tls, self.place, self.clock
        )

    def stop(self) -> None:
        """Stop the server by PID and remove its temporary work directory (if it made one)."""
        self.process.stop()
        if self.remove_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def tls_query(tls: ServiceTLS) -> str:
    """Return the URL query options of a client trusting ``tls``'s CA and presenting its cert."""
    files = {
        "ssl_ca_certs": tls.server.ca,
        "ssl_certfile": tls.client.cert,
        "ssl_keyfile": tls.client.key,
    }
    return "&".join(f"{name}={path}" for name, path in files.items())


def _spawn(
    binary: str,
    port: int,
    workdir: Path,
    tls: ServiceTLS | None,
    place: Place,
    clock: WallClock | None = None,
) -> LocalProcess:
    listen = ["--port", str(port)]
    if tls is not None:
        listen = [part for line in tls.redis_config(port) for part in _as_args(line)]
    argv = [
        binary,
        "--bind",
        place.address,
        *("--protected-mode", protected_mode(place)),
        *listen,
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(workdir),
        "--daemonize",
        "no",
    ]
    return spawn_redis(
        "redis",
        place.argv(argv),
        port=port,
        log_path=workdir / "redis.log",
        tls=tls,
        host=place.address,
        env=None if clock is None else clock.env(),
    )


def protected_mode(place: Place) -> str:
    """``yes`` on loopback, ``no`` elsewhere: a namespace's clients are not local to Redis.

    Protected mode refuses every client from another address when no password
    is set; on a private bridge those clients are the test's own hosts.
    """
    return "yes" if place.address == LOOPBACK else "no"


def _as_args(line: str) -> list[str]:
    """Turn a ``redis.conf`` line into command-line arguments (``--name value``)."""
    name, _, value = line.partition(" ")
    return [f"--{name}", value]


def spawn_redis(
    label: str,
    argv: list[str],
    *,
    port: int,
    log_path: Path,
    what: str = "redis-server",
    tls: ServiceTLS | None = None,
    host: str = LOOPBACK,
    env: dict[str, str] | None = None,
) -> LocalProcess:
    """Start a Redis process and wait for its PONG on ``host:port``; never leave it running.

    ``label`` names the process in logs, ``what`` names it in the error; with
    ``tls`` the PING goes over TLS, presenting the service's client certificate;
    ``env`` replaces the environment (a :class:`WallClock`'s preload).
    """
    process = LocalProcess.spawn(label, argv, log_path=log_path, env=env)
    probe = _answers_ping if tls is None else _answers_ping_over(tls.client_context(verify=False))
    try:
        wait_for_port(port, timeout=15, process=process.popen, probe=probe, host=host)
    except BaseException as exc:  # interrupted too (Ctrl-C, a test timeout): never leak it
        process.stop()
        if not isinstance(exc, Exception):
            raise
        raise RuntimeError(f"{what} did not start:\n{process.log_tail()}") from exc
    return process


def _answers_ping(sock: socket.socket) -> bool:
    """Whether the server on ``sock`` is a Redis (this one, if its process still runs).

    An open port is not enough: if another process took the port between
    ``free_port()`` and the bind, it would accept connections while this
    server exits with "address already in use".
    """
    sock.sendall(b"PING\r\n")
    return sock.recv(16).startswith(b"+PONG")


def _answers_ping_over(context: ssl.SSLContext) -> Callable[[socket.socket], bool]:
    """Return a probe that sends the PING over TLS (a TLS-only server ignores plain text)."""

    def probe(sock: socket.socket) -> bool:
        try:
            with context.wrap_socket(sock, server_hostname=LOOPBACK) as tls:
                return _answers_ping(tls)
        except ssl.SSLError:
            return False

    return probe
