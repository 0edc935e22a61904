"""One process of a replicated local Redis topology, and the polling its operations share.

:class:`RedisNode` is a ``redis-server`` or ``redis-sentinel`` started from a
config file in the topology's work directory. Unlike :class:`LocalRedis` it can
be killed, paused and restarted on its port: those are the failures the
Sentinel and Cluster scenarios replay. Control commands go through short-lived
synchronous clients: the topology's operations run in a worker thread (see
:func:`in_thread`), so a scenario's own event loop keeps renewing leases while
a failover is waited for.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from signal import SIGCONT, SIGSTOP
from typing import Any, Self, TypeVar, final

import anyio.to_thread
import redis

from ._proc import HERE, LocalProcess, Place
from ._redis import spawn_redis
from ._tls import ServiceTLS

T = TypeVar("T")

COMMAND_TIMEOUT = 2.0
"""Seconds a control command may take: generous on a loaded 2-core runner, short
enough that a paused or dead node is reported instead of waited for."""


@final
@dataclass
class RedisNode:
    """A ``redis-server`` or ``redis-sentinel`` on a loopback port, from its config file.

    ``argv`` is kept so :meth:`restart` brings the node back on the same port
    with the same config file (which Redis itself may have rewritten meanwhile:
    Sentinel and Cluster both record what they learnt there).
    """

    name: str
    port: int
    argv: list[str]
    log_path: Path
    process: LocalProcess
    tls: ServiceTLS | None = None
    place: Place = HERE

    @classmethod
    def start(
        cls,
        name: str,
        argv: list[str],
        *,
        port: int,
        log_path: Path,
        tls: ServiceTLS | None = None,
        place: Place = HERE,
    ) -> Self:
        """Start ``argv`` at ``place``; wait until it answers PING on ``port`` (TLS: ``tls``)."""
        process = _spawn(name, argv, port, log_path, tls, place)
        return cls(name, port, argv, log_path, process, tls=tls, place=place)

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)``, as clients and ``SENTINEL`` replies name it."""
        return (self.place.address, self.port)

    @property
    def pid(self) -> int:
        """The current process id (a restart changes it)."""
        return self.process.pid

    @property
    def alive(self) -> bool:
        """Whether the process runs (a paused process still runs)."""
        return self.process.popen.poll() is None

    @property
    def paused(self) -> bool:
        """Whether the process is stopped by SIGSTOP (state ``T`` in ``/proc``)."""
        return self.alive and _proc_state(self.pid) == "T"

    def client(self, *, decode: bool = True) -> redis.Redis:
        """Return a new synchronous client for control commands; close it (``with``) after use."""
        tls: dict[str, Any] = {} if self.tls is None else self.tls.redis_kwargs()
        return redis.Redis(
            host=self.place.address,
            port=self.port,
            decode_responses=decode,
            protocol=2,  # the reply shapes below are RESP2's (redis-py 8 defaults to RESP3)
            socket_timeout=COMMAND_TIMEOUT,
            socket_connect_timeout=COMMAND_TIMEOUT,
            **tls,
        )

    def command(self, *args: str | int) -> Any:
        """Send one command on a fresh connection and return its unparsed (decoded) reply.

        redis-py's reply parsers differ between versions and protocols; the
        topologies read Redis's own reply shapes instead.
        """
        with self.client() as client:
            client.response_callbacks.clear()
            return client.execute_command(*args)

    def info(self, section: str) -> dict[str, str]:
        """Return one ``INFO`` section as ``field -> value`` (values as Redis writes them)."""
        return fields(str(self.command("INFO", section)))

    def role(self) -> list[Any]:
        """Return the ``ROLE`` reply: ``["master", ...]``, ``["slave", host, port, state, ...]``."""
        return list(self.command("ROLE"))

    def kill(self) -> None:
        """SIGKILL the process and reap it: a crash, with no chance to tell anyone."""
        self.process.stop(signals=())

    def pause(self) -> None:
        """SIGSTOP the process; return once the kernel reports it stopped."""
        self.process.signal(SIGSTOP)
        poll_until(lambda: self.paused, timeout=5, what=f"{self.name} to stop")

    def resume(self) -> None:
        """SIGCONT a paused process; return once it runs again."""
        self.process.signal(SIGCONT)
        poll_until(lambda: not self.paused, timeout=5, what=f"{self.name} to continue")

    def restart(self, extra_args: Sequence[str] = ()) -> None:
        """Start a node that was killed again, on its port, from its config file.

        ``extra_args`` override the file (``--replicaof host port``) for this run.
        """
        if self.alive:
            raise RuntimeError(f"{self.name} is still running (pid {self.pid})")
        self.process.stop()  # closes the dead process's log handle
        argv = [*self.argv, *extra_args]
        self.process = _spawn(self.name, argv, self.port, self.log_path, self.tls, self.place)

    def stop(self) -> None:
        """Stop the process by PID (continuing it first, or SIGTERM would wait for SIGKILL)."""
        if self.paused:
            self.process.signal(SIGCONT)
        self.process.stop()


def cut_off(replica: RedisNode, master: RedisNode) -> None:
    """Pause ``replica`` and drop the master's replication links, so writes never reach it.

    SIGSTOP alone holds writes back only while the master lives: they wait in
    the paused replica's socket buffer, and it applies them on SIGCONT even if
    the master died meanwhile. With the link dropped first, a write from now on
    reaches ``replica`` only by a resync, which needs the master alive. Other
    (running) replicas of ``master`` reconnect and resync from the backlog at once.
    """
    replica.pause()
    master.command("CLIENT", "KILL", "TYPE", "replica")

    def dropped() -> bool:
        info = master.info("replication")
        return not any(
            f"port={replica.port}," in v for k, v in info.items() if k.startswith("slave")
        )

    poll_until(dropped, timeout=10, what=f"{master.name} to drop {replica.name}")


def _spawn(
    name: str, argv: list[str], port: int, log_path: Path, tls: ServiceTLS | None, place: Place
) -> LocalProcess:
    """Start one node at ``place`` and wait for its PONG; never leave it running on failure."""
    return spawn_redis(
        name, place.argv(argv), port=port, log_path=log_path, what=name, tls=tls, host=place.address
    )


def listen_config(port: int, tls: ServiceTLS | None) -> list[str]:
    """Return the config lines a node listens with: ``port``, or TLS only on it."""
    return [f"port {port}"] if tls is None else tls.redis_config(port)


def installed(*names: str, hint: str) -> list[str]:
    """Return the paths of ``names`` on PATH, or raise one line naming them and the fix."""
    found = [shutil.which(name) for name in names]
    if None in found:
        raise RuntimeError(
            f"{' and '.join(names)} must be installed; run scripts/bootstrap.sh ({hint})"
        )
    return [path for path in found if path is not None]


def _proc_state(pid: int) -> str:
    """Return the one-letter process state in ``/proc/<pid>/stat`` (``T`` when stopped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "?"
    return stat.rsplit(")", 1)[1].split()[0]  # the name in parentheses may hold spaces


def write_config(path: Path, lines: Iterable[str]) -> list[str]:
    """Write a config file (creating its directory) and return its lines, for errors."""
    text = [*lines]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(text) + "\n")
    return text


def fields(text: str) -> dict[str, str]:
    """Return ``field:value`` lines (``INFO``, ``CLUSTER INFO``) as a dict."""
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def pairs(reply: Sequence[Any]) -> dict[str, Any]:
    """Return a flat ``[key, value, key, value, ...]`` reply (``SENTINEL MASTER``) as a dict."""
    return dict(zip(reply[::2], reply[1::2], strict=True))


def poll_until(check: Callable[[], bool], *, timeout: float, what: str) -> None:
    """Return once ``check()`` is true; raise ``TimeoutError`` naming ``what`` after ``timeout``.

    A Redis error inside ``check`` counts as "not yet": a topology in the middle
    of a failover refuses connections and commands for a moment, by design.
    """
    deadline = time.monotonic() + timeout
    last_error: redis.RedisError | None = None
    while True:
        try:
            if check():
                return
        except redis.RedisError as exc:
            last_error = exc
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error!r})" if last_error is not None else ""
            raise TimeoutError(f"waited {timeout}s for {what}{detail}")
        time.sleep(0.05)


async def in_thread(operation: Callable[[], T]) -> T:
    """Run a blocking topology operation in a worker thread and return its result.

    The operations poll Redis for seconds; on the caller's event loop they would
    stall the very lease renewals a scenario is watching.
    """
    return await anyio.to_thread.run_sync(operation)
