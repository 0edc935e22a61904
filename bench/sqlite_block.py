"""How long a SQLite job's transaction block holds up the pod's other executions.

One executor on a SQLite file (``--store-timeout``, default 5 s) and the
in-memory leases: a report sleeps ``--block`` seconds inside its
``ctx.transaction()``; once it is inside, ten other job keys start a
transaction of one row each. Prints the report's outcome and time and the
others' times (from their start to their ending).

    .venv/bin/python bench/sqlite_block.py [--block 1,2,10] [--store-timeout 5]
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import tempfile
import time
from pathlib import Path

import anyio

from leaseworker import JobContext, ReportJob, open_store
from leaseworker._execution import Executor
from leaseworker.testing import MemoryLeases, make_trigger

OTHERS = 10


class Sleepy(ReportJob):
    """Sleeps payload ``block`` seconds inside its transaction, then writes its row."""

    topic = "reports.requested"
    lease_duration = 30.0

    def __init__(self) -> None:
        self.inside = anyio.Event()

    async def run(self, ctx: JobContext) -> object:
        """Run the block: the sleep (if any), the row, the result."""
        async with ctx.transaction() as tx:
            block = float(ctx.trigger.payload.get("block", 0))
            if block:
                self.inside.set()
                await anyio.sleep(block)
            await tx.execute("INSERT INTO report (k) VALUES (?)", (ctx.job_key,))
            tx.complete(None)
        return None


async def one(block: float, store_timeout: float) -> str:
    """Measure one block; return its line."""
    with tempfile.TemporaryDirectory(prefix="lw-bench-") as workdir:
        path = Path(workdir) / "store.sqlite3"
        with contextlib.closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("CREATE TABLE report (k text NOT NULL)")
        job = Sleepy()
        took: dict[str, tuple[str, float]] = {}
        async with open_store(f"sqlite:///{path}", call_timeout=store_timeout) as store:
            executor = Executor(job, MemoryLeases(), pod="bench", store=store)

            async def run(key: str, seconds: float) -> None:
                begun = time.monotonic()
                ending = await executor.run(make_trigger({"block": seconds}, key=key), key)
                took[key] = (ending.outcome, time.monotonic() - begun)

            async with anyio.create_task_group() as tg:
                tg.start_soon(run, "report", block)
                await job.inside.wait()
                for n in range(OTHERS):
                    tg.start_soon(run, f"other:{n}", 0.0)
    outcome, seconds = took.pop("report")
    times = [t for _, t in took.values()]
    outcomes = sorted({o for o, _ in took.values()})
    return (
        f"block {block:g} s: report {outcome} in {seconds:.2f} s; {OTHERS} others "
        f"{'/'.join(outcomes)} in {min(times):.2f}-{max(times):.2f} s"
    )


def main() -> None:
    """Measure each ``--block``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block", default="1,2,10")
    parser.add_argument("--store-timeout", type=float, default=5.0)
    args = parser.parse_args()
    for block in args.block.split(","):
        print(anyio.run(one, float(block), args.store_timeout), flush=True)


if __name__ == "__main__":
    main()
