"""Test jobs whose executions the tests can see and steer.

In-process tests use :class:`GateJob` with a :class:`Recorder`: every
execution records its start and stop and, when the payload says
``"gate": true``, waits for the test to open its job key's gate. Subprocess
tests use :class:`MarkerJob`, a sleeping job whose pods record their history
(``leaseworker run --record-history``, on ``time.monotonic()``: one clock for
every process on the machine).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio

from leaseworker import JobContext, ReportJob

from .process_work import add


@dataclass
class Run:
    """One execution as the job saw it."""

    key: str
    execution_id: str
    fence: int
    started: float
    stopped: float | None = None
    how: str = ""  # completed, cancelled, lost...


@dataclass
class Recorder:
    """Shared record of executions, with waits driven by events, not sleeps."""

    runs: list[Run] = field(default_factory=list)
    running: dict[str, int] = field(default_factory=dict)
    max_running: int = 0
    overlaps: int = 0
    gates: dict[str, anyio.Event] = field(default_factory=dict)
    _changed: anyio.Event = field(default_factory=anyio.Event)

    def gate(self, key: str) -> anyio.Event:
        """The event a gated execution of ``key`` waits for."""
        return self.gates.setdefault(key, anyio.Event())

    def runs_of(self, key: str) -> list[Run]:
        """Executions of ``key`` in start order."""
        return [run for run in self.runs if run.key == key]

    def done(self, key: str, how: str = "completed") -> int:
        """How many executions of ``key`` ended as ``how``."""
        return sum(1 for run in self.runs_of(key) if run.how == how)

    async def until(self, check: Callable[[], bool], *, within: float = 20) -> None:
        """Wait until ``check()`` holds; it is re-evaluated whenever an execution changes."""
        with anyio.fail_after(within):
            while True:
                changed = self._changed
                if check():
                    return
                await changed.wait()

    def start(self, ctx: JobContext) -> Run:
        """Record that an execution started."""
        run = Run(ctx.job_key, ctx.execution_id, ctx.fence, time.monotonic())
        self.runs.append(run)
        now = self.running.get(ctx.job_key, 0) + 1
        self.running[ctx.job_key] = now
        self.overlaps += now > 1
        self.max_running = max(self.max_running, sum(self.running.values()))
        self._notify()
        return run

    def stop(self, run: Run, how: str) -> None:
        """Record that an execution stopped."""
        run.stopped = time.monotonic()
        run.how = how
        self.running[run.key] -= 1
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()


class GateJob(ReportJob):
    """Records every execution; waits for its gate or sleeps as the payload says."""

    lease_duration = 3.0

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    async def run(self, ctx: JobContext) -> object:
        """Wait for the gate (``gate``), sleep (``seconds``), or end at once."""
        run = self.recorder.start(ctx)
        how = "cancelled"
        try:
            if ctx.trigger.payload.get("gate"):
                await self.recorder.gate(ctx.job_key).wait()
            await anyio.sleep(float(ctx.trigger.payload.get("seconds", 0)))
            await ctx.checkpoint()
            how = "completed"
        except BaseException:
            # hold() cancels the body when ownership is lost: tell the two apart.
            how = "cancelled" if ctx.owned else "lost"
            raise
        finally:
            self.recorder.stop(run, how)
        return {"key": ctx.job_key}


J = TypeVar("J", bound=ReportJob)


def on_topic(base: type[J], topic: str, **settings: Any) -> type[J]:
    """A subclass of ``base`` that listens on ``topic`` (jobs set topics per class)."""
    return type(base.__name__, (base,), {"topic": topic, **settings})


class MarkerJob(ReportJob):
    """Sleeps ``seconds`` from the payload, with checkpoints; its pod records what happened.

    Settings come from the environment, since ``leaseworker run`` builds it: ``LW_TEST_TOPIC``,
    ``LW_TEST_LEASE`` (seconds). When ``LW_TEST_SLOW_POD`` names a pod, only
    that pod sleeps the payload's ``seconds``; the others take 0.1 s (a
    takeover should not wait for a whole slow job again). A payload's ``add``
    (two numbers) makes it return their sum from ``ctx.run_in_process`` instead.
    """

    topic = os.environ.get("LW_TEST_TOPIC", "unset")
    lease_duration = float(os.environ.get("LW_TEST_LEASE", "3"))

    async def run(self, ctx: JobContext) -> object:
        """Sleep in small steps with checkpoints."""
        if "add" in ctx.trigger.payload:
            return await ctx.run_in_process(add, *ctx.trigger.payload["add"])
        seconds = float(ctx.trigger.payload.get("seconds", 0))
        slow_pod = os.environ.get("LW_TEST_SLOW_POD")
        if slow_pod and ctx.pod != slow_pod:
            seconds = 0.1
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            await ctx.checkpoint()
            await anyio.sleep(min(0.05, max(0.0, until - time.monotonic())))
        return None
