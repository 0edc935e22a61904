"""A private PostgreSQL cluster on a free loopback port, for tests and the demo.

Each :class:`LocalPostgres` runs the ``postgres`` binary directly on a copy of a
cluster ``initdb`` made once per installation (kept in the cache), with a random
superuser password on TCP, and drops to the ``postgres`` user when run as root.
Given :class:`TLSFiles` it serves TLS only (``ssl = on``, every TCP client through
``hostssl ... scram-sha-256``) and its URLs ask for ``sslmode=verify-full``
against the test CA. See docs/design.md#development-services.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from glob import glob
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from ._proc import (
    HERE,
    LOOPBACK,
    LocalProcess,
    Place,
    cache_dir,
    free_port,
    run_captured,
    service_workdir,
    wait_for_port,
)
from ._shipped import ToolMissingError
from ._tls import TLSFiles

if TYPE_CHECKING:
    from psycopg.abc import Query

DEBIAN_BIN_GLOB = "/usr/lib/postgresql/*/bin"
"""Where Debian's ``postgresql-NN`` packages put ``initdb`` and ``postgres``."""

SUPERUSER = "postgres"
"""Name of the database superuser that ``initdb`` creates."""

DEFAULT_DATABASE = "leaseworker"
"""The database :meth:`LocalPostgres.start` creates and :attr:`LocalPostgres.url` names."""

SERVICE_USER = "postgres"
"""The OS user the server runs as when leaseworker itself runs as root."""

# Durability is worthless for a throwaway cluster; these trade it for speed.
# wal_level=minimal needs max_wal_senders=0. jit=off avoids LLVM compile pauses
# on the first "expensive" query, which only add noise to test timings.
SERVER_SETTINGS: dict[str, str] = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "wal_level": "minimal",
    "max_wal_senders": "0",
    "jit": "off",
    "unix_socket_permissions": "0700",
    "log_min_messages": "warning",
}

_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")

TLS_ONLY_HBA = """\
local     all all                trust
hostssl   all all 127.0.0.1/32   scram-sha-256
hostssl   all all ::1/128        scram-sha-256
hostnossl all all 0.0.0.0/0      reject
hostnossl all all ::/0           reject
"""
"""``pg_hba.conf`` of a TLS server: SCRAM passwords over TLS, nothing in plain text."""


@dataclass(frozen=True)
class _RunAs:
    """The OS identity the PostgreSQL children run as (``None`` uid: unchanged)."""

    uid: int | None
    gid: int | None
    home: str | None

    @classmethod
    def for_current_process(cls) -> Self:
        """Pick the ``postgres`` system user when root, else keep the current user."""
        if os.geteuid() != 0:
            return cls(uid=None, gid=None, home=None)
        try:
            entry = pwd.getpwnam(SERVICE_USER)
        except KeyError:
            raise ToolMissingError(
                f"running as root, but there is no {SERVICE_USER!r} system user to run "
                "PostgreSQL as (PostgreSQL refuses to run as root); run "
                "scripts/bootstrap.sh, which installs Debian's postgresql package "
                "and with it that user"
            ) from None
        return cls(uid=entry.pw_uid, gid=entry.pw_gid, home=entry.pw_dir)

    @property
    def extra_groups(self) -> list[int] | None:
        """Supplementary groups for ``Popen``: none (drop root's) when switching users."""
        return None if self.uid is None else []

    def env(self) -> dict[str, str]:
        """Return the child environment: ours minus ``PG*`` variables, ``HOME`` adjusted."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        if self.home is not None:
            env["HOME"] = self.home
        return env

    def give(self, path: Path) -> None:
        """Make ``path`` owned by this identity (no-op when not switching users)."""
        if self.uid is not None and self.gid is not None:
            os.chown(path, self.uid, self.gid)

    def run(
        self, argv: list[str], *, cwd: Path, timeout: float
    ) -> subprocess.CompletedProcess[bytes]:
        """Run a one-shot PostgreSQL tool (initdb, pg_basebackup) as this identity."""
        return run_captured(
            argv,
            cwd=cwd,
            timeout=timeout,
            env=self.env(),
            user=self.uid,
            group=self.gid,
            extra_groups=self.extra_groups,
        )


def find_bindir(pattern: str = DEBIAN_BIN_GLOB) -> Path:
    """Return the directory holding ``initdb`` and ``postgres``.

    Prefers the highest PostgreSQL major version under Debian's
    ``/usr/lib/postgresql/*/bin``; falls back to an ``initdb`` on ``PATH`` (other
    distributions, Homebrew). Raises :class:`ToolMissingError` (a ``RuntimeError``)
    naming ``scripts/bootstrap.sh`` when neither exists.
    """

    def version(bindir: str) -> tuple[int, ...]:
        name = Path(bindir).parent.name
        return tuple(int(part) for part in name.split(".") if part.isdigit())

    candidates = [
        d
        for d in glob(pattern)
        if os.access(Path(d, "initdb"), os.X_OK) and os.access(Path(d, "postgres"), os.X_OK)
    ]
    if candidates:
        return Path(max(candidates, key=version))
    initdb = shutil.which("initdb")
    if initdb is not None and os.access(Path(initdb).with_name("postgres"), os.X_OK):
        return Path(initdb).parent
    raise ToolMissingError(
        f"PostgreSQL server binaries (initdb, postgres) not found in {pattern} or on PATH; "
        "run scripts/bootstrap.sh (it installs Debian's postgresql package)"
    )


@dataclass
class LocalPostgres:
    """A running private PostgreSQL cluster, stopped by PID with :meth:`stop`.

    ``start()`` returns once the server answered ``SELECT 1`` over TCP and the
    ``leaseworker`` database exists. The work directory holds the data directory
    (``data/``), the server log (``postgres.log``) and the Unix socket.
    """

    port: int
    workdir: Path
    process: LocalProcess
    password: str = field(repr=False)
    tls: TLSFiles | None = None
    place: Place = HERE
    _remove_workdir: bool = field(default=False, repr=False)
    _argv: tuple[dict[str, str], Mapping[str, str] | None] = field(
        default=({}, None), repr=False
    )  # the settings and environment it was started with (restart)

    @property
    def url(self) -> str:
        """The ``postgresql://`` URL of the ``leaseworker`` database."""
        return self.url_for(DEFAULT_DATABASE)

    def url_for(
        self, database: str, *, role: str = SUPERUSER, password: str | None = None, **params: str
    ) -> str:
        """Return the ``postgresql://`` URL of ``database`` as ``role`` (default: the superuser).

        On a TLS server the URL asks for ``sslmode=verify-full`` against the
        test CA unless ``params`` (libpq parameters) say otherwise.
        """
        secret = self.password if password is None else password
        if self.tls is not None:
            params = {"sslmode": "verify-full", "sslrootcert": str(self.tls.ca), **params}
        query = "&".join(f"{name}={value}" for name, value in params.items())
        where = f"{role}:{secret}@{self.place.address}:{self.port}/{database}"
        return f"postgresql://{where}" + (f"?{query}" if query else "")

    def create_role(self, name: str, *, password: str) -> None:
        """Create a login role with a SCRAM password and no other right (grant them apart)."""
        if not _IDENTIFIER.fullmatch(name):
            raise ValueError(f"role name must match {_IDENTIFIER.pattern}: {name!r}")
        from psycopg import sql

        create = sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}")
        self.execute(create.format(sql.Identifier(name), sql.Literal(password)))

    def execute(self, statement: Query, *, database: str = "postgres") -> None:
        """Run one statement as the superuser in ``database`` (autocommit): roles, grants."""
        import psycopg

        with psycopg.connect(self._admin_url(database), autocommit=True) as conn:
            conn.execute(statement)

    def query(self, statement: Query, *, database: str = "postgres") -> list[tuple[Any, ...]]:
        """Run one query as the superuser in ``database`` (autocommit) and return its rows."""
        import psycopg

        with psycopg.connect(self._admin_url(database), autocommit=True) as conn:
            return conn.execute(statement).fetchall()

    def _admin_url(self, database: str) -> str:
        """Return the superuser's URL for control statements: on a TLS server, its socket.

        Control works whatever certificate the server presents (an expired one, say).
        """
        return self.url_for(database) if self.tls is None else self._socket_url(database)

    def _socket_url(self, database: str) -> str:
        """Return the superuser's URL on the server's Unix socket (``trust``, no password)."""
        return f"postgresql://{SUPERUSER}@/{database}?host={self.workdir}&port={self.port}"

    @classmethod
    def start(
        cls,
        *,
        workdir: Path | None = None,
        timeout: float = 60.0,
        tls: TLSFiles | None = None,
        settings: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        place: Place = HERE,
    ) -> Self:
        """Create a fresh cluster, start the server, and wait until it serves queries.

        ``workdir`` must not contain a ``data`` directory yet; every path above it
        must be enterable by the server's OS user (``postgres`` when root). Keep it
        short: the Unix socket path inside it is limited to 107 bytes. Without
        ``workdir`` a temporary directory is used and removed again by :meth:`stop`.
        ``tls``: serve TLS only, with this certificate and key (see :data:`TLS_ONLY_HBA`).
        ``settings`` are added to the server's (``lc_messages``, say), ``env`` to its
        environment (``LOCPATH`` for a locale compiled apart). ``place``: run and
        listen there (a network namespace of ``Hosts``; not with ``tls``), taking
        SCRAM logins from its /24.
        """
        if tls is not None and place != HERE:
            raise ValueError("a TLS server runs on loopback only")
        bindir = find_bindir()
        run_as = _RunAs.for_current_process()
        password = secrets.token_hex(16)
        with service_workdir(workdir, "pg") as (workdir, remove):
            workdir.chmod(0o700)
            run_as.give(workdir)
            copied = _initdb(bindir, workdir, password, run_as, timeout=timeout)
            if place != HERE:
                with (workdir / "data" / "pg_hba.conf").open("a") as hba:
                    hba.write(f"host all all {place.address}/24 scram-sha-256\n")
            chosen = SERVER_SETTINGS if tls is None else _tls_settings(workdir, tls, run_as)
            server_settings = {**chosen, **(settings or {})}
        pg = cls.serve(
            workdir,
            password,
            server_settings,
            env=env,
            tls=tls,
            place=place,
            remove=remove,
            timeout=timeout,
        )
        try:
            if copied:  # the kept cluster's password until here: set on the socket
                import psycopg
                from psycopg import sql

                alter = sql.SQL("ALTER ROLE {} PASSWORD {}")
                with psycopg.connect(pg._socket_url("postgres"), autocommit=True) as conn:
                    conn.execute(alter.format(sql.Identifier(SUPERUSER), sql.Literal(password)))
            pg.create_database(DEFAULT_DATABASE)
        except BaseException:
            pg.stop()
            raise
        return pg

    @classmethod
    def serve(
        cls,
        workdir: Path,
        password: str,
        settings: dict[str, str],
        *,
        env: Mapping[str, str] | None = None,
        tls: TLSFiles | None = None,
        place: Place = HERE,
        remove: bool = False,
        timeout: float = 60.0,
        port: int | None = None,
    ) -> Self:
        """Start the server on the data directory ``workdir/data`` already made; wait for it.

        :meth:`start` calls it after ``initdb``; a standby's copy is served the same
        way. ``password`` is the superuser's; ``remove``: :meth:`stop` removes ``workdir``;
        ``port``: listen there (a replaced host's address) instead of on a free one.
        """
        run_as = _RunAs.for_current_process()
        port = free_port() if port is None else port
        try:
            process = _spawn(find_bindir(), workdir, port, run_as, settings, env, place)
        except BaseException:
            if remove:
                shutil.rmtree(workdir, ignore_errors=True)
            raise
        pg = cls(
            port=port,
            workdir=workdir,
            process=process,
            password=password,
            tls=tls,
            place=place,
            _remove_workdir=remove,
            _argv=(settings, env),
        )
        try:
            pg._wait_ready(timeout=timeout)
        except Exception as exc:
            tail = process.log_tail()
            pg.stop()
            raise RuntimeError(f"postgres did not become ready:\n{tail}") from exc
        except BaseException:
            pg.stop()
            raise
        return pg

    def create_database(self, name: str) -> str:
        """Create database ``name`` and return its URL.

        Meant for test isolation: one cluster, a fresh database per test. ``name``
        must be a plain lower-case identifier so it needs no quoting in URLs.
        """
        if not _IDENTIFIER.fullmatch(name):
            raise ValueError(f"database name must match {_IDENTIFIER.pattern}: {name!r}")
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url_for("postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url_for(name)

    def replace_certificate(self, tls: TLSFiles, *, timeout: float = 10.0) -> None:
        """Serve ``tls``'s certificate and key from now on (reloaded, no restart).

        Returns once a new TLS connection is shown the new certificate: the
        postmaster reloads on a signal, after ``pg_reload_conf()`` returned.
        """
        if self.tls is None:
            raise RuntimeError("this PostgreSQL was started without TLS")
        for name, source in (("server.crt", tls.cert), ("server.key", tls.key)):
            target = self.workdir / name
            shutil.copyfile(source, target)
            target.chmod(0o600)
            _RunAs.for_current_process().give(target)
        self.execute(b"SELECT pg_reload_conf()")
        wanted = ssl.PEM_cert_to_DER_cert(
            tls.cert.read_text().split("-----END CERTIFICATE-----")[0]
            + "-----END CERTIFICATE-----\n"
        )
        deadline = time.monotonic() + timeout
        while _served_certificate(self.port) != wanted:
            if time.monotonic() > deadline:
                raise TimeoutError("postgres did not reload its certificate")
            time.sleep(0.05)

    def restart(self, *, timeout: float = 60.0) -> None:
        """Stop the server (fast shutdown: its sessions end) and start it again on its data.

        Same port, settings and databases; returns once it serves queries again.
        """
        self.process.stop(timeout, signals=(signal.SIGINT, signal.SIGQUIT, signal.SIGTERM))
        settings, env = self._argv
        run_as = _RunAs.for_current_process()
        self.process = _spawn(
            find_bindir(), self.workdir, self.port, run_as, settings, env, self.place
        )
        self._wait_ready(timeout=timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server by PID and remove a temporary work directory.

        ``LocalProcess.stop`` sends SIGTERM, which the postmaster treats as a
        *smart* shutdown that waits for every client to disconnect, so a leaked
        pool would stall it. This sends SIGINT (*fast* shutdown: abort
        transactions, disconnect clients, checkpoint) first, then SIGQUIT
        (*immediate*) if that times out, then SIGTERM and SIGKILL. Safe to call twice.
        """
        self.process.stop(timeout, signals=(signal.SIGINT, signal.SIGQUIT, signal.SIGTERM))
        if self._remove_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _wait_ready(self, *, timeout: float) -> None:
        """Block until its port is open and a real connection runs ``SELECT 1``, or raise.

        An open port is not enough: while starting up the server accepts
        connections only to reject them with "the database system is starting up".
        The connection is the superuser's on the socket (a copied cluster's
        password is set only after); :meth:`start` then logs in over TCP.
        """
        import psycopg

        deadline = time.monotonic() + timeout
        wait_for_port(
            self.port, timeout=timeout, process=self.process.popen, host=self.place.address
        )
        while True:
            if self.process.popen.poll() is not None:
                raise RuntimeError(
                    f"postgres {self.process.pid} exited with {self.process.popen.returncode}"
                )
            try:
                with psycopg.connect(self._socket_url("postgres"), connect_timeout=2) as conn:
                    conn.execute("SELECT 1").fetchone()
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
            else:
                return


def _initdb(bindir: Path, workdir: Path, password: str, run_as: _RunAs, *, timeout: float) -> bool:
    """Make ``workdir/data``, owned by ``run_as``: a copy of the kept cluster, else ``initdb``.

    ``initdb`` took 1.3 s of each start; with a copy of its result (about 40 MB in
    1,000 files) a start takes about 0.7 s less. The first ``initdb`` of an
    installation (its ``bindir``) is kept in the cache; two starts at once may each
    keep one, the first rename wins. Return whether ``data`` is a copy: its
    superuser's password is then the kept cluster's, for :meth:`LocalPostgres.start`
    to set on the socket before any TCP login. Raises with ``initdb``'s output when
    it fails.
    """
    kept = cache_dir("postgres") / f"cluster-{_digest(str(bindir.resolve()))}"
    data = workdir / "data"
    if (kept / "PG_VERSION").is_file():
        shutil.copytree(kept, data, symlinks=True)
        for path in [data, *data.rglob("*")]:
            run_as.give(path)
        return True
    _run_initdb(bindir, workdir, password, run_as, timeout=timeout)
    partial = kept.with_name(f"{kept.name}.{uuid.uuid4().hex}")
    shutil.copytree(data, partial, symlinks=True)
    try:
        partial.rename(kept)
    except OSError:  # another start kept its own first
        shutil.rmtree(partial, ignore_errors=True)
    return False


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _run_initdb(
    bindir: Path, workdir: Path, password: str, run_as: _RunAs, *, timeout: float
) -> None:
    """Run ``initdb`` into ``workdir/data`` as ``run_as``; raise with its output on failure."""
    pwfile = workdir / "pwfile"
    pwfile.write_text(password + "\n")
    pwfile.chmod(0o600)
    run_as.give(pwfile)
    argv = [
        str(bindir / "initdb"),
        "--pgdata",
        str(workdir / "data"),
        "--username",
        SUPERUSER,
        "--pwfile",
        str(pwfile),
        "--auth-local",
        "trust",
        "--auth-host",
        "scram-sha-256",
        "--encoding",
        "UTF8",
        "--locale",
        "C",
        "--no-sync",
        "--no-instructions",
    ]
    try:
        result = run_as.run(argv, cwd=workdir, timeout=timeout)
    finally:
        pwfile.unlink(missing_ok=True)
    if result.returncode != 0:
        output = result.stdout.decode(errors="replace")
        raise RuntimeError(f"initdb failed with exit code {result.returncode}:\n{output}")


def _served_certificate(port: int) -> bytes | None:
    """Return the DER certificate the server on ``port`` presents (unverified), or ``None``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((LOOPBACK, port), timeout=2) as sock:
            sock.sendall(struct.pack("!ii", 8, 80877103))  # SSLRequest
            if sock.recv(1) != b"S":
                return None
            with context.wrap_socket(sock) as tls:
                return tls.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError):
        return None


def _tls_settings(workdir: Path, tls: TLSFiles, run_as: _RunAs) -> dict[str, str]:
    """Install ``tls`` for the server (its key readable by it alone) and TLS-only access.

    Returns the server settings with ``ssl`` on. PostgreSQL refuses a key file
    that others may read, so certificate and key are copied into the work
    directory and given to the server's OS user.
    """
    copies = {}
    for name, source in (("server.crt", tls.cert), ("server.key", tls.key), ("ca.crt", tls.ca)):
        target = workdir / name
        shutil.copyfile(source, target)
        target.chmod(0o600)
        run_as.give(target)
        copies[name] = str(target)
    (workdir / "data" / "pg_hba.conf").write_text(TLS_ONLY_HBA)
    return {
        **SERVER_SETTINGS,
        "ssl": "on",
        "ssl_cert_file": copies["server.crt"],
        "ssl_key_file": copies["server.key"],
        "ssl_ca_file": copies["ca.crt"],
    }


def _spawn(
    bindir: Path,
    workdir: Path,
    port: int,
    run_as: _RunAs,
    settings: dict[str, str],
    env: Mapping[str, str] | None,
    place: Place = HERE,
) -> LocalProcess:
    """Start the ``postgres`` server in the foreground at ``place``, logging to ``postgres.log``.

    Entering a namespace needs root, so there ``setpriv`` drops to ``run_as`` inside it.
    """
    argv = [
        str(bindir / "postgres"),
        "-D",
        str(workdir / "data"),
        "-h",
        place.address,
        "-p",
        str(port),
        "-k",
        str(workdir),
    ]
    for name, value in settings.items():
        argv += ["-c", f"{name}={value}"]
    drop = (run_as.uid, run_as.gid, run_as.extra_groups)
    if place.prefix:
        if run_as.uid is not None:
            ids = (f"--reuid={run_as.uid}", f"--regid={run_as.gid}", "--clear-groups")
            argv = ["setpriv", *ids, *argv]
        argv, drop = place.argv(argv), (None, None, None)
    return LocalProcess.spawn(
        "postgres",
        argv,
        log_path=workdir / "postgres.log",
        env={**run_as.env(), **(env or {})},
        cwd=workdir,
        user=drop[0],
        group=drop[1],
        extra_groups=drop[2],
    )
