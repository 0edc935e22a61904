"""The stack demo's moving parts: local services, ``leaseworker run`` pods, Kafka helpers.

:func:`local_stack` starts LocalRedis, LocalKafka and (when its binary is
already built) LocalJaeger, and stops whatever it started on the way out,
also on Ctrl-C or an error. :class:`PodProcess` is one ``leaseworker run``
child process whose Redis traffic goes through a :class:`ChaosProxy` owned by
the demo, so the demo can stall one pod's Redis while the others keep theirs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from aiokafka.admin import AIOKafkaAdminClient  # type: ignore[import-untyped]

from .._chaos import ChaosProxy
from ._services import LocalJaeger, LocalRedis
from ._services._kafka import LocalKafka
from ._services._shipped import shipped

EXAMPLE = "examples/report_job"
"""Where ``demo_report.py`` lives (shipped in the wheel too); the pods' working directory."""


@dataclass
class Stack:
    """The running local services and the demo's scratch directory."""

    redis: LocalRedis
    kafka: LocalKafka
    jaeger: LocalJaeger | None
    workdir: Path


@contextlib.contextmanager
def local_stack() -> Iterator[Stack]:
    """Start the services (Kafka and Jaeger in parallel); stop all of them afterwards."""
    workdir = Path(tempfile.mkdtemp(prefix="leaseworker-demo-"))
    started: list[Any] = []
    try:
        try:
            redis = LocalRedis.start()
            started.append(redis)
            kafka, jaeger = start_in_parallel(
                [
                    LocalKafka.start,
                    LocalJaeger.start if LocalJaeger.binary_path().is_file() else None,
                ],
                started,
            )
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)  # nothing ran: no pod logs to keep
            raise
        yield Stack(redis, kafka, jaeger, workdir)
    finally:
        for service in reversed(started):
            with contextlib.suppress(Exception):
                service.stop()


def start_in_parallel(starters: list[Callable[[], Any] | None], started: list[Any]) -> list[Any]:
    """Run each starter in its own thread; every service that came up lands in ``started``.

    Even when one start fails or Ctrl-C interrupts the wait, the others are
    waited for and recorded, so the caller's cleanup stops them too.
    """
    pool = ThreadPoolExecutor(max_workers=len(starters), thread_name_prefix="demo-start")
    futures = [pool.submit(start) if start else None for start in starters]
    try:
        return [future.result() if future else None for future in futures]
    finally:
        pool.shutdown(wait=True)
        started += [f.result() for f in futures if f is not None and f.exception() is None]


def telemetry_flags(stack: Stack) -> list[str]:
    """Return the pods' telemetry flags: the hook that points traces at the demo's Jaeger.

    Empty when Jaeger is not built; otherwise every pod exports its traces to
    the local Jaeger (``--otlp-endpoint``, an OTLP/HTTP base URL).
    """
    if stack.jaeger is None:
        return []
    return ["--otlp-endpoint", stack.jaeger.otlp_http_endpoint]


@dataclass
class PodProcess:
    """One ``leaseworker run`` pod: its process, its log file, its Redis proxy."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    proxy: ChaosProxy

    def log_text(self) -> str:
        """Return what the pod logged so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def assigned(self) -> str:
        """Return the partitions of its latest logged assignment (``""`` before any)."""
        lines = [line for line in self.log_text().splitlines() if "partitions assigned: " in line]
        return lines[-1].split("partitions assigned: ", 1)[1].strip() if lines else ""

    def running(self) -> bool:
        """Whether the process has not exited."""
        return self.process.poll() is None

    async def stop(self, within: float) -> int:
        """SIGTERM (drain), SIGKILL after ``within`` seconds; return the exit code."""
        if self.running():
            self.process.send_signal(signal.SIGTERM)
        with anyio.move_on_after(within):
            while self.running():  # noqa: ASYNC110 - another process cannot set an Event
                await anyio.sleep(0.05)
        if self.running():
            self.process.kill()
        return await anyio.to_thread.run_sync(self.process.wait)


def spawn_pod(name: str, proxy: ChaosProxy, args: list[str], env: dict[str, str]) -> PodProcess:
    """Start ``leaseworker run <args> --pod name`` with its Redis URL through ``proxy``."""
    log = Path(env["LEASEWORKER_DEMO_MARKERS"]).with_name(f"{name}.log")
    argv = [
        *(sys.executable, "-m", "leaseworker._cli", "--log-level", "INFO", "run"),
        *args,
        *("--pod", name, "--redis-url", f"redis://127.0.0.1:{proxy.port}/0"),
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv,
            cwd=shipped(EXAMPLE),
            env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return PodProcess(name, process, log, proxy)


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
