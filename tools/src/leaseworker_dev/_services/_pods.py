"""The one pod process: a ``leaseworker run`` child the demo, the campaign and the tests start.

:func:`pod_process` describes a pod (its argv: the job, ``--pod``, its Redis
URL, a loopback ``--health-port``, ``--record-history`` into its work
directory); :class:`PodProcess` starts it (again after an exit or a kill,
appending to its log), asks its ``/readyz`` whether it is ready, signals,
stops and reaps it, and remembers every exit. A pod's Redis may go through a
:class:`~leaseworker.testing.ChaosProxy` its owner holds, so one pod's Redis
can be stalled while the others keep theirs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio
from aiokafka.admin import AIOKafkaAdminClient  # type: ignore[import-untyped]

from leaseworker.toolkit import ChaosProxy, Execution, History, merge

from ._proc import HERE, LOOPBACK, Place, free_port

T = TypeVar("T")

Exit = tuple[int | None, bool, float]
"""One exit of a pod's process: its code, whether its owner killed it, when (monotonic)."""


@dataclass
class PodProcess:
    """One ``leaseworker run`` pod: its process (replaced on restart), files, ports and exits.

    ``stopping`` is set while its owner ends the process, so :meth:`exited`
    reports only exits the pod made by itself.
    """

    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    log: Path
    health_port: int | None = None
    health_host: str = LOOPBACK
    history: Path | None = None
    proxy: ChaosProxy | None = None
    exits: list[Exit] = field(default_factory=list)
    stopping: bool = False
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)  # running
    _last: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _logged_before: int = field(default=0, repr=False)  # the log's size when _last started

    @property
    def process(self) -> subprocess.Popen[bytes]:
        """The latest process, running or ended (``RuntimeError`` before the first start)."""
        if self._last is None:
            raise RuntimeError(f"pod {self.name} was never started")
        return self._last

    def start(self) -> PodProcess:
        """Start (or restart) the process, appending to its log; return the pod."""
        self.stopping = False
        with self.log.open("ab") as out:
            self._logged_before = out.tell()
            self._process = self._last = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return self

    def running(self) -> bool:
        """Whether the process runs (a stopped, frozen one counts as running)."""
        return self._process is not None and self._process.poll() is None

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the process if it still runs."""
        if self._process is not None and self.running():
            self._process.send_signal(signum)

    def log_text(self) -> str:
        """Return what the pod logged so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def last_words(self) -> str:
        """Return why the latest process ended, as it said: its last error line, else its last line.

        The log holds every start of the pod; only the latest one's lines are
        read. ``leaseworker run`` names what made it exit 2 in one
        ``...: error: ...`` line, which shutdown noise may follow.
        """
        if not self.log.exists():
            return ""
        with self.log.open("rb") as log:
            log.seek(self._logged_before)
            lines = [line for line in log.read().decode(errors="replace").splitlines() if line]
        errors = [line for line in lines if ": error: " in line]
        return (errors or lines or [""])[-1]

    def readiness(self) -> dict[str, Any] | None:
        """Return the pod's ``/readyz`` answer (``None`` while it does not answer)."""
        if self.health_port is None:
            raise RuntimeError(f"pod {self.name} serves no health endpoints")
        url = f"http://{self.health_host}:{self.health_port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=2.0) as reply:
                answer: dict[str, Any] = json.loads(reply.read())
        except urllib.error.HTTPError as error:
            with error:
                answer = json.loads(error.read())
        except (OSError, ValueError):
            return None
        return answer

    def assigned(self) -> int:
        """Partitions the pod holds while ``/readyz`` says ready (0 otherwise)."""
        answer = self.readiness()
        if answer is None or answer.get("status") != "ready":
            return 0
        return int(answer["kafka"]["assigned_partitions"])

    def recorded(self) -> History:
        """Return the executions its ``--record-history`` file holds so far."""
        if self.history is None or not self.history.exists():
            return History(clock="monotonic")
        return History.from_json(self.history.read_text(encoding="utf-8"))

    def kill(self) -> int | None:
        """SIGKILL and reap the process; record the exit as its owner's. ``None``: not running."""
        self.stopping = True
        self.signal(signal.SIGKILL)
        return self._reaped(killed=True)

    async def stop(self, within: float) -> int | None:
        """SIGCONT then SIGTERM (drain), SIGKILL after ``within`` seconds; return the code."""
        self.stopping = True
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        with anyio.move_on_after(within):
            while self.running():  # noqa: ASYNC110 - another process cannot set our Event
                await anyio.sleep(0.05)
        self.signal(signal.SIGKILL)
        return await anyio.to_thread.run_sync(self._reaped, False)

    async def wait_exit(self, within: float) -> int:
        """Wait for the process to exit by itself (polled: another process); return its code."""
        with anyio.fail_after(within):
            while (code := self.process.poll()) is None:  # noqa: ASYNC110 - a child process
                await anyio.sleep(0.05)
        return code

    def exited(self) -> int | None:
        """Return the code of a process that ended by itself since the last look, else ``None``."""
        if self.stopping or self._process is None or self._process.poll() is None:
            return None
        code = self._process.returncode
        self._process = None
        self.exits.append((code, False, time.monotonic()))
        return code

    def _reaped(self, killed: bool) -> int | None:
        process, self._process = self._process, None
        if process is None:
            return None
        code = process.wait(30)
        self.exits.append((code, killed, time.monotonic()))
        return code


def pod_process(
    name: str,
    job: str,
    *,
    workdir: Path,
    redis_url: str | None = None,
    flags: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    proxy: ChaosProxy | None = None,
    record_history: bool = True,
    health: bool = True,
    log_level: str = "INFO",
    place: Place = HERE,
    python: str = sys.executable,
) -> PodProcess:
    """Describe pod ``name`` running ``job`` (not started yet; :meth:`PodProcess.start`).

    Its log (and history file) go to ``workdir``; ``env`` adds to this
    process's environment; ``health`` serves ``/readyz`` on a free port of its
    place's address; ``place``: where it runs (loopback, or a network namespace);
    ``python``: the interpreter (another release's virtualenv, for a rolling upgrade).
    """
    history = workdir / f"history-{name}.jsonl" if record_history else None
    health_port = free_port() if health else None
    serve = ("--health-port", str(health_port), "--health-host", place.address)
    argv = [
        *place.prefix,
        *(python, "-m", "leaseworker._cli", "--log-level", log_level, "run", job),
        *("--pod", name),
        *(("--redis-url", redis_url) if redis_url else ()),
        *(serve if health_port else ()),
        *(("--record-history", str(history)) if history else ()),
        *flags,
    ]
    return PodProcess(
        name=name,
        argv=argv,
        env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
        cwd=cwd or Path.cwd(),
        log=workdir / f"{name}.log",
        health_port=health_port,
        health_host=place.address,
        history=history,
        proxy=proxy,
    )


def histories(pods: Sequence[PodProcess]) -> History:
    """Merge what every pod recorded into one history (one monotonic clock: one machine)."""
    return merge([pod.recorded() for pod in pods])


def executions_of(pods: Sequence[PodProcess], key: str) -> list[Execution]:
    """Return the executions of ``key`` the pods recorded so far, in start order."""
    return sorted(
        (e for e in histories(pods).executions if e.job_key == key), key=lambda e: e.start
    )


def first_expiry(execution: Execution) -> float | None:
    """When Redis could first expire the execution's key, from its ``stopped`` step."""
    for step in execution.steps:
        if step.name == "stopped" and "margin_ms" in step.attrs:
            return step.at + float(step.attrs["margin_ms"]) / 1000
    return None


async def until_found(check: Callable[[], T], *, within: float, what: str) -> T:
    """Poll other processes' state (histories, marks) until ``check()`` is truthy; return it.

    Raises ``TimeoutError`` naming ``what`` after ``within`` seconds.
    """
    with anyio.move_on_after(within):
        while not (found := check()):  # noqa: ASYNC110 - other processes cannot set our Event
            await anyio.sleep(0.01)
        return found
    raise TimeoutError(f"waited {within:.0f}s for {what}")


async def until_ready(pods: Sequence[PodProcess], *, within: float, partitions: bool) -> float:
    """Wait until every pod's ``/readyz`` says ready (and, with ``partitions``, it holds one).

    Returns the seconds it took; raises ``TimeoutError`` naming the pods not ready.
    """
    began = time.monotonic()

    def ready(pod: PodProcess) -> bool:
        if partitions:
            return pod.assigned() > 0
        answer = pod.readiness()
        return answer is not None and answer.get("status") == "ready"

    def _all_ready() -> bool:
        return all(ready(p) for p in pods)

    with anyio.move_on_after(within):
        while not await anyio.to_thread.run_sync(_all_ready):  # noqa: ASYNC110 - other processes
            await anyio.sleep(0.1)
        return time.monotonic() - began
    late = [p.name for p in pods if not ready(p)]
    raise TimeoutError(f"{', '.join(late)} not ready within {within:.0f}s (see /readyz)")


async def until_committed(
    bootstrap: str, groups: Sequence[str], topic: str, count: int, *, within: float
) -> None:
    """Wait until each of ``groups`` committed ``count`` records of ``topic`` (its pods idle)."""
    with anyio.fail_after(within):
        for group in groups:
            while await committed_total(bootstrap, group, topic) < count:  # noqa: ASYNC110 - a broker's state
                await anyio.sleep(0.1)


async def committed_total(bootstrap: str, group: str, topic: str) -> int:
    """Sum of the group's committed positions over ``topic``'s partitions (bounded call)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    with anyio.fail_after(10):
        await admin.start()
        try:
            offsets = await admin.list_consumer_group_offsets(group)
        finally:
            await admin.close()
    return sum(meta.offset for tp, meta in offsets.items() if tp.topic == topic and meta.offset > 0)
