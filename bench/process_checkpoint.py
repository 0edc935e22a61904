"""What ``ProcessContext.checkpoint()`` costs in a job's child process (aim: under 1 µs).

Runs ``bench/process_jobs.py:checkpoints`` in a one-worker pool: ``--count`` calls
each of ``checkpoint()``, ``owned`` and ``remaining()`` (an empty loop's time
subtracted), ``--rounds`` times, and prints the median and the spread per call in
nanoseconds. Each reads the deadline and the loss flag from shared memory (a
seqlock: one ``struct.unpack_from`` of 40 bytes) and the monotonic clock: no
system call, no round trip to the pod.

    .venv/bin/python bench/process_checkpoint.py [--count 1000000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
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


async def main(count: int, rounds: int) -> None:
    """Measure, then print one line per figure."""
    results: dict[str, list[float]] = {}
    async with ProcessPool(1) as pool:
        for _ in range(rounds):
            figures = await pool.run(
                process_jobs.checkpoints,
                (count,),
                {},
                identity=Identity("bench", "bench-1", 1),
                deadline=time.monotonic() + 3600,
                follow=_follow,
            )
            for name, seconds in figures.items():
                results.setdefault(name, []).append(seconds * 1e9)
    print(f"load {os.getloadavg()[0]:.1f}, {count:,} calls x {rounds} rounds, ns per call:")
    for name, values in results.items():
        spread = f"{min(values):.0f}-{max(values):.0f}"
        print(f"  {name:<11} median {statistics.median(values):.0f} ({spread})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    anyio.run(main, options.count, options.rounds)
