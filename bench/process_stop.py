"""Stop latency: from cancelling a call that computes in a child to that child killed and reaped.

Each kill: a call of ``process_work.spin_forever`` starts in a warm worker
and burns CPU; once the child has said it runs (its pid, through a FIFO),
the calling task's cancel scope is cancelled, and the time to the call's
return is measured (the pool has then killed the child's process group and
reaped it; the bench checks, through a pidfd, that the child is gone).
Sides:

- ``pool``: leaseworker's ``ProcessPool.run`` (what ``run_in_process`` calls);
- ``anyio``: ``anyio.to_process.run_sync(cancellable=True)``, which kills
  the worker (not its group) and waits for it.

``ProcessPoolExecutor`` is not a side: it cannot stop a call that runs.
Every side runs ``--kills`` kills on an idle machine, then again with
``--hogs`` processes (default: the cores) spinning beside it; the figures
are p50, p99 and the worst of each set.

    .venv/bin/python bench/process_stop.py [--kills 1000] [--hogs N] [--sides pool,anyio]
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
from collections.abc import Iterator
from pathlib import Path

import anyio
from process_dispatch import Side, all_sides, children_path

import process_work


async def one_kill(side: Side, fifo: int, fifo_path: str) -> float:
    """Start a spinning call, cancel it once the child runs; return cancel-to-return seconds."""
    scope = anyio.CancelScope()
    ended: list[float] = []

    async def call() -> None:
        try:
            with scope:
                await side.call(process_work.spin_forever, (fifo_path,))
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
    return ended[0] - began


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


async def bench(args: argparse.Namespace) -> None:
    """Measure each side idle, then loaded; print the percentiles."""
    wanted = args.sides.split(",")
    with tempfile.TemporaryDirectory(prefix="leaseworker-stop-") as scratch:
        fifo_path = str(Path(scratch) / "started")
        os.mkfifo(fifo_path)
        fifo = os.open(fifo_path, os.O_RDONLY | os.O_NONBLOCK)
        keep = os.open(fifo_path, os.O_WRONLY)  # a writer always open: no end-of-file between calls
        try:
            async with all_sides(args.workers, only=wanted) as sides:
                for condition, count in (("idle", 0), (f"{args.hogs} hogs", args.hogs)):
                    with hogs(count):
                        for side in sides:
                            seconds = [
                                await one_kill(side, fifo, fifo_path) for _ in range(args.kills)
                            ]
                            print(f"{side.name:<6} {condition:<8} {_summary(seconds)}", flush=True)
        finally:
            os.close(keep)
            os.close(fifo)


def _summary(seconds: list[float]) -> str:
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
    return (
        f"{len(ordered)} kills: p50 {statistics.median(ordered) * 1000:.2f} ms, "
        f"p99 {p99 * 1000:.2f} ms, worst {ordered[-1] * 1000:.2f} ms"
    )


def main() -> None:
    """Parse the flags and measure."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--kills", type=int, default=1000)
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--sides", default="pool,anyio")
    args = parser.parse_args()
    children_path()
    print(f"load {' '.join(f'{v:.1f}' for v in os.getloadavg())}", flush=True)
    anyio.run(bench, args)


if __name__ == "__main__":
    main()
