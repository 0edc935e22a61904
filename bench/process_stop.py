"""Stop latency of ``ProcessPool.run``: a cancellation to the child's group killed and reaped.

Each of ``--kills`` rounds runs ``bench/process_jobs.py:spin`` (a CPU loop) on a warm
worker, lets it compute for ``--compute`` seconds, cancels the awaiting task and
times the cancel to the child killed and reaped (its usage reported), and to
``run()``'s exit (the replacement's start, about 5 ms, comes in between). Prints
p50 / p99 / max in milliseconds and the load; run it once on an idle machine and
once with ``--load N`` (N processes of busy loops beside it).

    .venv/bin/python bench/process_stop.py [--kills 1000] [--compute 0.005] [--load 0]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import anyio
import process_jobs

from leaseworker import ProcessPool
from leaseworker._process import Identity, Mirror


def _follow(mirror: Mirror) -> Callable[[], None]:
    return _unfollow


def _unfollow() -> None:
    return None


async def _one(
    pool: ProcessPool, fn: Callable[..., object], reaped: list[float] | None = None
) -> object:
    return await pool.run(
        fn,
        (),
        {},
        identity=Identity("bench", "bench-1", 1),
        deadline=time.monotonic() + 3600,
        follow=_follow,
        usage=None if reaped is None else lambda usage: reaped.append(time.perf_counter()),
    )


async def main(kills: int, compute: float) -> tuple[list[float], list[float]]:
    """Return the latencies in seconds: cancel to the child reaped, cancel to run()'s exit."""
    reaped: list[float] = []
    exited: list[float] = []
    async with ProcessPool(1) as pool:
        for _ in range(kills):
            await _one(pool, process_jobs.nothing)  # the replacement is warm (one worker)
            async with anyio.create_task_group() as group:
                group.start_soon(_one, pool, process_jobs.spin, reaped)
                await anyio.sleep(compute)
                cancelled = time.perf_counter()
                group.cancel_scope.cancel()
            exited.append(time.perf_counter() - cancelled)
            reaped[-1] -= cancelled
    return reaped, exited


def _figures(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (
        f"p50 {statistics.median(ordered) * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms, "
        f"max {ordered[-1] * 1000:.2f} ms"
    )


def _report(latencies: tuple[list[float], list[float]]) -> None:
    reaped, exited = latencies
    print(f"load {os.getloadavg()[0]:.1f}, {len(reaped)} kills")
    print(f"  cancel to child reaped: {_figures(reaped)}")
    print(f"  cancel to run() exit:   {_figures(exited)} (the replacement's start included)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=1000)
    parser.add_argument("--compute", type=float, default=0.005)
    parser.add_argument("--load", type=int, default=0, help="busy-loop processes beside it")
    options = parser.parse_args()
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(options.load)
    ]
    try:
        _report(anyio.run(main, options.kills, options.compute))
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
