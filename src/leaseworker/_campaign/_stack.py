"""The campaign's services and pods: Kafka, Redis (one node or Sentinel), the store, N pods.

:func:`services` starts the local services in parallel and stops each one it
started by PID on the way out. The completion store is a private PostgreSQL
behind a :class:`~leaseworker.testing.ChaosProxy` (so it can be taken away),
or, without PostgreSQL installed, an SQLite file. :class:`Pod` is one
``leaseworker run`` process of the user's job (through the stall wrapper),
with its own Redis proxy on the single-node topology and its own history file.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio

from .._chaos import ChaosProxy
from .._dev._pods import start_in_parallel
from .._dev._services import LocalPostgres, LocalRedis, LocalRedisCluster, LocalSentinelGroup
from .._dev._services._kafka import LocalKafka
from ._stall import DIR_VARIABLE, JOB_VARIABLE

Topology = Literal["single", "sentinel", "cluster"]

POD_FLAGS = (
    *("--session-timeout", "6", "--heartbeat-interval", "1", "--revoke-timeout", "2"),
    *("--shutdown-timeout", "3", "--redis-timeout", "0.5", "--store-timeout", "2"),
    *("--max-poll-interval", "20"),
)
"""Short Kafka and call timings, so hand-overs take seconds (the job's lease is its own)."""


@dataclass
class Services:
    """The running services; ``store_url`` is the campaign's direct view of the store."""

    kafka: LocalKafka
    workdir: Path
    store_url: str
    redis: LocalRedis | None = None
    sentinel: LocalSentinelGroup | None = None
    cluster: LocalRedisCluster | None = None
    postgres: LocalPostgres | None = None
    store_proxy: ChaosProxy | None = None  # set by :func:`store_proxy`

    @property
    def shared_redis_url(self) -> str:
        """The URL of a replicated topology (pods connect to it directly, no proxy)."""
        if self.sentinel is not None:
            return self.sentinel.url
        assert self.cluster is not None
        return self.cluster.url

    @property
    def redis_port(self) -> int:
        """The single node's port (pods' proxies forward to it)."""
        assert self.redis is not None
        return self.redis.port


@contextlib.contextmanager
def services(topology: Topology, store_url: str | None, workdir: Path) -> Iterator[Services]:
    """Start Kafka, Redis (a node, Sentinel or a cluster), a PostgreSQL (without ``store_url``)."""
    started: list[Any] = []
    redis_start: Callable[[], Any] = LocalRedis.start
    if topology == "sentinel":
        redis_start = LocalSentinelGroup.start
    elif topology == "cluster":
        redis_start = LocalRedisCluster.start
    postgres_start = _postgres_or_none if store_url is None else None
    try:
        kafka, redis, postgres = start_in_parallel(
            [LocalKafka.start, redis_start, postgres_start], started
        )
        if store_url is None:
            store_url = postgres.url if postgres else f"sqlite:///{workdir / 'completions.db'}"
        yield Services(
            kafka=kafka,
            workdir=workdir,
            store_url=store_url,
            redis=redis if isinstance(redis, LocalRedis) else None,
            sentinel=redis if isinstance(redis, LocalSentinelGroup) else None,
            cluster=redis if isinstance(redis, LocalRedisCluster) else None,
            postgres=postgres,
        )
    finally:
        for service in reversed(started):
            if service is not None:
                with contextlib.suppress(Exception):
                    service.stop()


def _postgres_or_none() -> LocalPostgres | None:
    """Start a private PostgreSQL, or return ``None`` where it is not installed (SQLite instead)."""
    try:
        return LocalPostgres.start()
    except (FileNotFoundError, RuntimeError):
        return None


@contextlib.asynccontextmanager
async def store_proxy(stack: Services) -> AsyncIterator[str]:
    """Yield the store URL the pods use: through a proxy when the store is our PostgreSQL."""
    if stack.postgres is None:
        yield stack.store_url
        return
    async with ChaosProxy(stack.postgres.port) as proxy:
        stack.store_proxy = proxy
        yield stack.store_url.replace(f":{stack.postgres.port}/", f":{proxy.port}/")


@dataclass
class Pod:
    """One ``leaseworker run`` pod: its process (replaced on restart), proxy and files."""

    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    history: Path
    log: Path
    proxy: ChaosProxy | None
    process: subprocess.Popen[bytes] | None = None
    exits: list[tuple[int | None, bool, float]] = field(default_factory=list)  # code, killed, at
    stopping: bool = False  # the campaign is ending the process: its exit is expected

    def start(self) -> None:
        """Start (or restart) the process, appending to its log."""
        self.stopping = False
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def running(self) -> bool:
        """Whether the process runs (a stopped, frozen one counts as running)."""
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: signal.Signals) -> None:
        """Send ``signum`` to the process if it still runs."""
        if self.running():
            assert self.process is not None
            self.process.send_signal(signum)

    def assigned(self) -> bool:
        """Whether its log shows a partition assignment with partitions in it."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        lines = [line for line in text.splitlines() if "partitions assigned: " in line]
        return bool(lines) and not lines[-1].rstrip().endswith("none")

    async def kill(self) -> int | None:
        """SIGKILL and reap the process; record the exit as the campaign's own."""
        self.stopping = True
        self.signal(signal.SIGKILL)
        return await self._reaped(killed=True)

    async def stop(self, within: float) -> int | None:
        """SIGCONT then SIGTERM (drain), SIGKILL after ``within`` seconds; return the code."""
        self.stopping = True
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        with anyio.move_on_after(within):
            while self.running():  # noqa: ASYNC110 - another process cannot set our Event
                await anyio.sleep(0.1)
        if self.running():
            assert self.process is not None
            self.process.kill()
        return await self._reaped(killed=False)

    def exited(self) -> int | None:
        """Return the code of a process that ended by itself since the last look, else ``None``."""
        if self.stopping or self.process is None or self.process.poll() is None:
            return None
        code = self.process.returncode
        self.process = None
        self.exits.append((code, False, time.monotonic()))
        return code

    async def _reaped(self, *, killed: bool) -> int | None:
        process = self.process
        if process is None:
            return None
        code = await anyio.to_thread.run_sync(process.wait)
        self.process = None
        self.exits.append((code, killed, time.monotonic()))
        return code


def make_pod(
    name: str,
    *,
    job: str,
    redis_url: str,
    store_url: str,
    flags: list[str],
    workdir: Path,
    proxy: ChaosProxy | None,
) -> Pod:
    """Describe pod ``name`` running ``job`` from the current directory (not started yet)."""
    history = workdir / f"history-{name}.jsonl"
    argv = [
        *(sys.executable, "-m", "leaseworker._cli", "--log-level", "INFO", "run"),
        "leaseworker._campaign._stall:StallingJob",
        *("--pod", name, "--redis-url", redis_url, "--record-history", str(history)),
        *flags,
    ]
    env = {
        **os.environ,
        JOB_VARIABLE: job,
        DIR_VARIABLE: str(workdir),
        "LEASEWORKER_STORE_URL": store_url,
        "PYTHONUNBUFFERED": "1",
    }
    return Pod(
        name=name,
        argv=argv,
        env=env,
        cwd=Path.cwd(),
        history=history,
        log=workdir / f"{name}.log",
        proxy=proxy,
    )
