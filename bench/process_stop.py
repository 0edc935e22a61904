"""Stop latency: from cancelling a call that computes in a child to that child killed and reaped.

Each kill: a call of ``bench/process_jobs.py:spin`` starts in a warm worker and
burns CPU; once the child has said it runs (its pid, through a FIFO), the
awaiting task's cancel scope is cancelled and two times are taken: to the
child reaped (``ProcessPool.run``'s usage report, which comes after the reap)
and to the call's return (the cancellation gone on). The bench then checks,
through a pidfd, that the child is gone. Sides:

- ``pool``: leaseworker's ``ProcessPool.run`` (what ``run_in_process`` calls),
  one worker, whose replacement starts off the measured path;
- ``anyio``: ``anyio.to_process.run_sync(cancellable=True)``, which kills
  the worker (not its group) and waits for it before the cancellation goes on
  (its next call starts a new worker: outside the measure).

``ProcessPoolExecutor`` is not a side: it cannot stop a call that runs.
Every side runs ``--kills`` kills on the machine as it is, then again with
``--hogs`` processes (default: the cores) spinning beside it; the figures
are p50, p99 and the worst of each set.

    .venv/bin/python bench/process_stop.py [--kills 1000] [--hogs N] [--sides pool,anyio]
        [--no-as-is]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import process_jobs
from process_dispatch import Side, anyio_side, children_path

from leaseworker import ProcessPool
from leaseworker._process import Identity, Mirror, Usage


def _unfollow() -> None:
    """Nothing to stop following."""


def _follow(_mirror: Mirror) -> Callable[[], None]:
    return _unfollow


@contextlib.asynccontextmanager
async def pool_side(reaped: list[float]) -> AsyncIterator[Side]:
    """One worker of ``ProcessPool``; each call's usage report time goes to ``reaped``."""
    identity = Identity(job_key="bench", execution_id="bench-1", fence=1)

    def note(_usage: Usage) -> None:
        reaped.append(time.perf_counter())

    async with ProcessPool(1, preload=("process_jobs",)) as pool:
        await pool.start()

        async def call(fn: Callable[..., Any], args: tuple[object, ...]) -> object:
            deadline = time.monotonic() + 3600
            return await pool.run(
                fn, args, {}, identity=identity, deadline=deadline, follow=_follow, usage=note
            )

        yield Side("pool", call)


async def one_kill(side: Side, fifo: int, fifo_path: str) -> tuple[float, float]:
    """Start a spinning call, cancel it once the child runs; return when it cancelled, ended."""
    scope = anyio.CancelScope()
    ended: list[float] = []

    async def call() -> None:
        try:
            with scope:
                await side.call(process_jobs.spin, (fifo_path,))
        finally:
            ended.append(time.perf_counter())

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        with anyio.fail_after(60):
            await anyio.wait_readable(fifo)
        pid = int(os.read(fifo, 64).split()[0])
        watch = os.pidfd_open(pid)
        began = time.perf_counter()
        scope.cancel()
    try:
        if not select.select([watch], [], [], 0)[0]:
            raise AssertionError(f"{side.name}: child {pid} still runs after its call ended")
    finally:
        os.close(watch)
    return began, ended[0]


@contextlib.contextmanager
def hogs(count: int) -> Iterator[None]:
    """Run ``count`` CPU-bound processes beside the bench; kill them by pid on the way out."""
    started = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for process in started:
            process.kill()
            process.wait()


async def kills(side: Side, reaped: list[float], count: int, fifo: int, path: str) -> list[str]:
    """Kill ``count`` calls of ``side``; return its figure lines."""
    reaped.clear()
    cancels: list[float] = []
    ends: list[float] = []
    for _ in range(count):
        began, ended = await one_kill(side, fifo, path)
        cancels.append(began)
        ends.append(ended - began)
    lines = []
    if reaped:
        lines.append(
            f"to the child reaped {_figures([r - c for r, c in zip(reaped, cancels, strict=True)])}"
        )
    lines.append(f"to the call's end {_figures(ends)}")
    return lines


async def bench(args: argparse.Namespace) -> None:
    """Measure each side as the machine is, then beside the hogs; print the percentiles."""
    wanted = args.sides.split(",")
    reaped: list[float] = []
    with tempfile.TemporaryDirectory(prefix="leaseworker-stop-") as scratch:
        fifo_path = str(Path(scratch) / "started")
        os.mkfifo(fifo_path)
        fifo = os.open(fifo_path, os.O_RDONLY | os.O_NONBLOCK)
        keep = os.open(fifo_path, os.O_WRONLY)  # a writer always open: no end-of-file between calls
        try:
            async with contextlib.AsyncExitStack() as stack:
                sides = []
                if "pool" in wanted:
                    sides.append(await stack.enter_async_context(pool_side(reaped)))
                if "anyio" in wanted:
                    sides.append(await stack.enter_async_context(anyio_side(1)))
                conditions = [("as is", 0), (f"{args.hogs} hogs", args.hogs)]
                for condition, count in conditions[0 if args.as_is else 1 :]:
                    with hogs(count):
                        for side in sides:
                            lines = await kills(side, reaped, args.kills, fifo, fifo_path)
                            for line in lines:
                                print(f"{side.name:<6} {condition:<8} {line}", flush=True)
        finally:
            os.close(keep)
            os.close(fifo)


def _figures(seconds: list[float]) -> str:
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
    return (
        f"({len(ordered)} kills): p50 {statistics.median(ordered) * 1000:.2f} ms, "
        f"p99 {p99 * 1000:.2f} ms, worst {ordered[-1] * 1000:.2f} ms"
    )


def main() -> None:
    """Parse the flags and measure."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--kills", type=int, default=1000)
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--sides", default="pool,anyio")
    parser.add_argument(
        "--no-as-is", dest="as_is", action="store_false", help="only the run beside the hogs"
    )
    args = parser.parse_args()
    children_path()
    print(f"load {' '.join(f'{v:.1f}' for v in os.getloadavg())}", flush=True)
    anyio.run(bench, args)


if __name__ == "__main__":
    main()
