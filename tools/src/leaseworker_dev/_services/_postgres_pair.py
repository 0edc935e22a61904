"""A PostgreSQL primary with a streaming standby on loopback ports, and its promotion.

:meth:`LocalPostgresPair.start` starts a :class:`LocalPostgres` primary with
WAL for replication, copies it with ``pg_basebackup -R`` (a physical
replication slot of its own, ``standby.signal`` and ``primary_conninfo``
written by the tool) and serves the copy as a hot standby, a second
:class:`LocalPostgres`. Synchronous (the default): every commit waits for the
standby's flush (``synchronous_standby_names = '*'``, ``synchronous_commit =
on``); asynchronous: it does not. Pods reach it through :attr:`url`, a
multi-host URL with ``target_session_attrs=read-write``, so libpq connects to
whichever node is the primary. :meth:`kill_primary` kills the primary's server
and its children (a host gone, nothing shut down in order) and :meth:`promote`
makes the standby the primary (``pg_promote``). Plain TCP only (no TLS).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from ._local_postgres import (
    DEFAULT_DATABASE,
    SERVER_SETTINGS,
    SUPERUSER,
    LocalPostgres,
    _RunAs,
    find_bindir,
)
from ._proc import LOOPBACK, service_workdir

SLOT = "standby"
"""The standby's physical replication slot (the primary keeps WAL until the standby has it)."""


def replication_settings(*, synchronous: bool) -> dict[str, str]:
    """Return the settings of both nodes: WAL for a standby, commits waiting for it or not.

    ``synchronous_standby_names`` is not among them: set on the command line it
    would outrank ``ALTER SYSTEM``, and the primary may name its standby only
    once the standby streams (before, every commit would wait for nobody).
    """
    return {
        **SERVER_SETTINGS,
        "wal_level": "replica",
        "max_wal_senders": "4",
        "max_replication_slots": "4",
        "hot_standby": "on",
        "wal_receiver_status_interval": "1s",
        "synchronous_commit": "on" if synchronous else "off",
    }


@dataclass
class LocalPostgresPair:
    """A running primary and streaming standby; :meth:`stop` stops every node by PID.

    ``start()`` returns once the standby streams from the primary (and, when
    synchronous, is the primary's synchronous standby). After :meth:`promote`
    the former standby is :attr:`primary` and :attr:`standby` is ``None``
    until :meth:`rejoin` copies the new primary into a new standby.
    """

    primary: LocalPostgres
    standby: LocalPostgres | None
    synchronous: bool
    _nodes: tuple[LocalPostgres, ...] = field(default=(), repr=False)  # what the URL names
    _started: list[LocalPostgres] = field(default_factory=list, repr=False)

    @classmethod
    def start(cls, *, synchronous: bool = True, timeout: float = 60.0) -> Self:
        """Start the primary, copy it, start the standby; wait until the standby streams."""
        settings = replication_settings(synchronous=synchronous)
        primary = LocalPostgres.start(settings=settings, timeout=timeout)
        pair = cls(primary=primary, standby=None, synchronous=synchronous, _started=[primary])
        try:
            pair._add_standby(timeout=timeout)
        except BaseException:
            pair.stop()
            raise
        return pair

    def rejoin(self, *, timeout: float = 60.0) -> None:
        """After a promotion: stop the former primary, give the new one a standby, wait for it.

        The new standby is a fresh copy (``pg_basebackup``), as a replaced
        host's would be, listening on the former primary's port: the URL
        names the same two addresses, so clients given it before (pods)
        reach the pair after every promotion and rejoin.
        """
        if self.standby is not None:
            raise RuntimeError("the pair has its standby")
        for node in self._started:
            if node is not self.primary:
                node.stop()
        former = [node.port for node in self._nodes if node is not self.primary]
        self._add_standby(timeout=timeout, port=former[0] if former else None)

    def _add_standby(self, *, timeout: float, port: int | None = None) -> None:
        settings = replication_settings(synchronous=self.synchronous)
        self.standby = _standby_of(self.primary, settings, timeout=timeout, port=port)
        self._started.append(self.standby)
        if self._nodes and port is not None:  # the same addresses, in the same order
            self._nodes = tuple(self.standby if n.port == port else n for n in self._nodes)
        else:
            self._nodes = (self.primary, self.standby)
        if self.synchronous:  # only now: a commit would wait for a standby not there yet
            self.primary.execute(b"ALTER SYSTEM SET synchronous_standby_names = '*'")
            self.primary.execute(b"SELECT pg_reload_conf()")
        self.wait_streaming(timeout=timeout)

    @property
    def nodes(self) -> tuple[LocalPostgres, ...]:
        """Every node this pair started, running or not (the stopped ones' directories gone)."""
        return tuple(self._started)

    @property
    def url(self) -> str:
        """The multi-host ``postgresql://`` URL of the ``leaseworker`` database."""
        return self.url_for(DEFAULT_DATABASE)

    def url_for(self, database: str, **params: str) -> str:
        """Return the superuser's multi-host URL of ``database``: whichever node is primary.

        Both nodes, first the one started as the primary, with
        ``target_session_attrs=read-write`` unless ``params`` say otherwise.
        """
        hosts = ",".join(f"{LOOPBACK}:{node.port}" for node in self._nodes)
        query = "&".join(
            f"{name}={value}"
            for name, value in {"target_session_attrs": "read-write", **params}.items()
        )
        return f"postgresql://{SUPERUSER}:{self.primary.password}@{hosts}/{database}?{query}"

    def create_database(self, name: str) -> str:
        """Create database ``name`` on the primary (the standby replays it); return its URL."""
        self.primary.create_database(name)
        return self.url_for(name)

    def wait_streaming(self, *, timeout: float = 30.0) -> None:
        """Block until the standby streams (synchronous: and is the synchronous standby)."""
        state = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + timeout
        while not self._streaming(state):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the standby did not stream ({state}) within {timeout}s")
            time.sleep(0.05)

    def _streaming(self, state: str) -> bool:
        rows = self.primary.query(
            b"SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'"
        )
        return (state,) in rows

    def walsender_pid(self) -> int:
        """Return the PID of the primary's process that sends the standby its WAL."""
        [(pid,)] = self.primary.query(b"SELECT pid FROM pg_stat_replication")
        return int(pid)

    def kill_primary(self) -> None:
        """Kill the primary's server and every process it started at once (SIGKILL).

        No shutdown, no last WAL sent: a host gone. Each child of the server
        runs in a session of its own, so they are killed one by one (a WAL
        sender stopped by a test would otherwise outlive it).
        """
        process = self.primary.process
        children = _children(process.pid)
        process.signal(signal.SIGKILL)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.popen.wait()
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.01)  # init reaps them; a zombie has no working directory left

    def promote(self, *, timeout: float = 60.0) -> LocalPostgres:
        """Promote the standby (``pg_promote``, waited for); return it, now :attr:`primary`."""
        if self.standby is None:
            raise RuntimeError("there is no standby to promote")
        seconds = max(1, round(timeout))
        [(done,)] = self.standby.query(f"SELECT pg_promote(true, {seconds})".encode())
        if not done:
            raise TimeoutError(f"the standby was not promoted within {seconds}s")
        self.primary, self.standby = self.standby, None
        return self.primary

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every server by PID (a killed one is only reaped) and remove their directories."""
        for node in reversed(self._started):
            node.stop(timeout)


def _standby_of(
    primary: LocalPostgres, settings: dict[str, str], *, timeout: float, port: int | None = None
) -> LocalPostgres:
    """Copy ``primary`` with ``pg_basebackup -R`` into a new directory; serve it as its standby.

    ``port``: where it listens (a free one without).
    """
    run_as = _RunAs.for_current_process()
    with service_workdir(None, "pg-standby") as (workdir, remove):
        workdir.chmod(0o700)
        run_as.give(workdir)
        conninfo = (
            f"host={LOOPBACK} port={primary.port} user={SUPERUSER} "
            f"password={primary.password} application_name={SLOT}"
        )
        argv = [
            str(find_bindir() / "pg_basebackup"),
            *("--pgdata", str(workdir / "data"), "--dbname", conninfo),
            *("--write-recovery-conf", "--create-slot", "--slot", SLOT),
            *("--wal-method", "stream", "--checkpoint", "fast", "--no-sync", "--no-password"),
        ]
        result = run_as.run(argv, cwd=workdir, timeout=timeout)
        if result.returncode != 0:
            output = result.stdout.decode(errors="replace")
            code = result.returncode
            raise RuntimeError(f"pg_basebackup failed with exit code {code}:\n{output}")
    return LocalPostgres.serve(
        workdir, primary.password, settings, remove=remove, timeout=timeout, port=port
    )


def _children(pid: int) -> list[int]:
    """Return the PIDs of the processes whose parent is ``pid`` (Linux ``/proc``)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (not a zombie: it has a working directory)."""
    try:
        os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return False
    return True
