"""Start, wait for, and stop a local service process; pick free loopback ports."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from signal import SIGKILL, SIGTERM, Signals
from typing import IO, Self

from ._byte_locks import ByteLocks

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class Place:
    """Where a service process runs and listens: an address, and how to start a process there.

    The default is this host's loopback. A network namespace of
    :class:`~leaseworker_dev._services._hosts.Hosts` is another place: its
    address on the bridge, and ``ip netns exec <namespace>`` before the argv.
    """

    address: str = LOOPBACK
    prefix: tuple[str, ...] = ()

    def argv(self, argv: list[str]) -> list[str]:
        """Return ``argv`` as started at this place."""
        return [*self.prefix, *argv]


HERE = Place()
"""This host's loopback: where every service runs unless told otherwise."""


def cache_dir(*parts: str) -> Path:
    """Return (and create) a cache directory outside the clone.

    ``LEASEWORKER_CACHE`` overrides the default ``$XDG_CACHE_HOME/leaseworker``
    (``~/.cache/leaseworker``), so CI and developers reuse downloads across clones.
    """
    root = os.environ.get("LEASEWORKER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "leaseworker"
    )
    path = Path(root, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def free_port() -> int:
    """Return a TCP port on loopback that nothing listens on, reserved for this process.

    Chosen below the kernel's ephemeral range when there is room: the port is
    bound by a service seconds later (a JVM starting), and a port from the
    ephemeral range could meanwhile be handed to one of the many outgoing
    connections the suite makes. Ports below it are only ever taken by
    listeners that ask for them.

    Between the pick and the service's bind the port is free, so a second
    picker could choose it too (two fixtures, two pytest workers, two sessions
    on one machine). Each pick is therefore reserved until this process ends:
    no other call here, in this process or any other on the machine, returns
    it meanwhile (see :data:`PORT_RESERVATIONS`). A port is picked again only
    after its picker exited, when whatever it started binds it or is gone.
    """
    with _RESERVED.lock:
        for port in _candidates():
            if not _RESERVED.take(port):
                continue  # reserved, by this process or another
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((LOOPBACK, port))
                except OSError:  # taken, or lingering from an earlier use: try another
                    _RESERVED.give_back(port)
                    continue
            return port
    raise RuntimeError("no free loopback port found (every candidate taken or reserved)")


_FIXED_LOW = 20000
"""Lowest port :func:`free_port` picks (well above the ports services usually own)."""

_RANDOM = random.SystemRandom()  # not the shared generator, which tests may seed

PORT_RESERVATIONS = Path("/tmp/leaseworker-ports.lock")
"""The one file whose byte ``n`` a process locks to reserve port ``n`` (:class:`ByteLocks`).

Not under ``$TMPDIR``: the test suite gives each session a directory of its own
there, and the reservations must be seen by every session. The last holder to
exit removes it.
"""


def _candidates() -> Iterator[int]:
    """Yield ports to try: the whole fixed range from a random start, else the kernel's picks."""
    low = _ephemeral_low()
    if low > _FIXED_LOW + 1000:
        start = _RANDOM.randrange(_FIXED_LOW, low)
        yield from range(start, low)
        yield from range(_FIXED_LOW, start)
        return
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((LOOPBACK, 0))
            yield int(sock.getsockname()[1])


_RESERVED = ByteLocks(PORT_RESERVATIONS, 0o666)  # every user's processes lock it


def distinct_free_ports(count: int) -> list[int]:
    """Return ``count`` different free loopback ports, each reserved like ``free_port()``'s."""
    return [free_port() for _ in range(count)]


@contextlib.contextmanager
def service_workdir(workdir: Path | None, name: str) -> Iterator[tuple[Path, bool]]:
    """Yield a service's work directory and whether it is temporary, for its ``start()``.

    Without ``workdir`` a fresh ``leaseworker-<name>-*`` directory is made: the
    service's ``stop()`` removes it later (the flag says so), and it is removed
    here already when the body (writing config, spawning) fails.
    """
    remove = workdir is None
    path = Path(tempfile.mkdtemp(prefix=f"leaseworker-{name}-")) if workdir is None else workdir
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield path, remove
    except BaseException:
        if remove:
            shutil.rmtree(path, ignore_errors=True)
        raise


def _ephemeral_low() -> int:
    """Return the first port of the kernel's range for outgoing connections (Linux), else 0."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def wait_for_port(
    port: int,
    *,
    timeout: float,
    process: subprocess.Popen[bytes] | None = None,
    probe: Callable[[socket.socket], bool] | None = None,
    host: str = LOOPBACK,
) -> None:
    """Block until something accepts TCP connections on ``host:port`` (and answers ``probe``).

    Raises ``RuntimeError`` early when ``process`` exits first, so a service that
    fails to start is reported at once instead of after the whole timeout.
    ``probe`` gets the connected socket (0.5 s timeout) and says whether the
    right server answered; an open port alone could be another process's.
    """
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process {process.pid} exited with {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), 0.5) as sock:
            sock.settimeout(0.5)
            if probe is None or (probe(sock) and (process is None or process.poll() is None)):
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing answered on {host}:{port} within {timeout}s")
        time.sleep(0.05)


def run_captured(
    argv: list[str],
    *,
    cwd: Path,
    timeout: float,
    env: dict[str, str] | None = None,
    user: int | None = None,
    group: int | None = None,
    extra_groups: list[int] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run a one-shot tool (initdb, Kafka's storage format, Maven) to completion.

    Output (stdout and stderr together) is captured for error messages; the
    return code is the caller's to check. ``user``/``group`` drop privileges.
    """
    return subprocess.run(
        argv,
        check=False,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env=env,
        timeout=timeout,
        user=user,
        group=group,
        extra_groups=extra_groups,
    )


@dataclass
class LocalProcess:
    """A service process started by leaseworker, with its log file.

    ``stop()`` sends SIGTERM, waits, then SIGKILLs; it is safe to call twice.
    The process runs in its own session so a Ctrl-C in the parent's terminal
    does not kill it before the parent had a chance to stop it in order.
    """

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    _log: IO[bytes] | None = field(default=None, repr=False)

    @classmethod
    def spawn(
        cls,
        name: str,
        argv: list[str],
        *,
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        user: int | None = None,
        group: int | None = None,
        extra_groups: list[int] | None = None,
    ) -> Self:
        """Start ``argv`` with stdout and stderr appended to ``log_path``.

        ``user``, ``group`` and ``extra_groups`` drop privileges in the child
        (servers such as PostgreSQL refuse to run as root).
        """
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = log_path.open("ab")
        try:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,
                user=user,
                group=group,
                extra_groups=extra_groups,
            )
        except BaseException:
            log.close()
            raise
        return cls(name=name, popen=popen, log_path=log_path, _log=log)

    @property
    def pid(self) -> int:
        """The operating-system process id."""
        return self.popen.pid

    def log_tail(self, lines: int = 30) -> str:
        """Return the last lines of the process log, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def signal(self, signum: Signals) -> None:
        """Send ``signum`` to the process unless it already exited."""
        if self.popen.poll() is None:
            self.popen.send_signal(signum)

    def stop(self, timeout: float = 10.0, *, signals: tuple[Signals, ...] = (SIGTERM,)) -> None:
        """Stop the process by PID: each of ``signals`` in turn, then SIGKILL.

        Each signal gets ``timeout`` seconds to work. Safe to call twice.
        """
        for signum in signals:
            self.signal(signum)
            try:
                self.popen.wait(timeout)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            self.signal(SIGKILL)
            self.popen.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
