"""A CPU-bound job that never awaits, taken over from a pod whose Redis is black-holed.

Two real pods (``leaseworker run``), a 3 s lease, one local Kafka and Redis;
``--trials`` trials with the job's CPU loop in a child through
``ctx.run_in_process``, then ``--loop-trials`` with the same loop in the
event loop (see ``leaseworker_dev._campaign._takeover``). Each trial prints
its overlap (A's code after B had the key: A's last mark, or its child's exit
as the kernel reports it), how long before its key could expire and before
its local deadline A's code ended, the child's exit after the recorded loss,
and how long the takeover took. The summary: overlaps per kind, the smallest
margins, the kernel-measured stop latency p50/p99/worst.

    .venv/bin/python bench/process_takeover.py [--trials 50] [--loop-trials 3]

Exit 1 if a ``run_in_process`` trial overlapped, or its child outlived the
local deadline.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

from leaseworker_dev._campaign import Trial, Where, ahead, takeover_trials
from leaseworker_dev._services import LocalStack


def summary(trials: list[Trial], wall: float) -> tuple[list[str], bool]:
    """Return the summary lines and whether every ``run_in_process`` trial held."""
    lines: list[str] = []
    held = True
    for where in ("process", "loop"):
        kind = [t for t in trials if t.where == where]
        if not kind:
            continue
        overlapped = [t for t in kind if t.overlap > 0]
        margins = [t.margin for t in kind if t.margin is not None]
        deadlines = [t.deadline_margin for t in kind if t.deadline_margin is not None]
        line = (
            f"{where:<7} {len(kind)} trials, {len(overlapped)} overlapped"
            f" (worst {max((t.overlap for t in kind), default=0.0) * 1000:.0f} ms)"
        )
        if margins and deadlines:
            line += (
                f"; A's code ended at worst {ahead(min(margins))} its key could expire, "
                f"{ahead(min(deadlines))} its local deadline"
            )
        lines.append(line)
        stops = sorted(t.exited - t.lost for t in kind if t.exited is not None and t.lost)
        if stops:
            p99 = stops[min(len(stops) - 1, math.ceil(0.99 * len(stops)) - 1)]
            lines.append(
                "        child exit after the loss (kernel): "
                f"p50 {statistics.median(stops) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
                f"worst {stops[-1] * 1000:.1f} ms"
            )
        takeovers = [t.taken - t.blackholed for t in kind]
        lines.append(
            f"        takeover after the black-hole: median {statistics.median(takeovers):.2f}s"
        )
        if where == "process":
            held = not overlapped and all(d > 0 for d in deadlines) and len(deadlines) == len(kind)
    lines.append(
        f"wall time {wall / 60:.1f} min, load {' '.join(f'{v:.1f}' for v in os.getloadavg())}"
    )
    return lines, held


def main() -> int:
    """Start Kafka and Redis, run the trials, print every trial and the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--loop-trials", type=int, default=3)
    args = parser.parse_args()
    plan: list[Where] = ["process"] * args.trials
    plan += ["loop"] * args.loop_trials
    began = time.monotonic()
    with LocalStack() as stack, tempfile.TemporaryDirectory(prefix="leaseworker-takeover-") as work:
        stack.start("kafka", "redis")
        trials = anyio.run(
            lambda: takeover_trials(
                bootstrap=stack.kafka.bootstrap_servers,
                redis_port=stack.redis.port,
                workdir=Path(work),
                plan=plan,
                out=lambda line: print(line, flush=True),
            )
        )
    lines, held = summary(trials, time.monotonic() - began)
    print("\n".join(lines))
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
