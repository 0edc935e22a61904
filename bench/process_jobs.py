"""Functions the process-pool benches run in a child (a module, so the child can import them).

Each takes the call's context first, as ``run_in_process`` passes it (a
``ProcessContext``); the baselines (``anyio.to_process``,
``ProcessPoolExecutor``) pass ``None`` there, so every side pickles the same
arguments and runs the same code. The benches put this directory on the
children's ``PYTHONPATH`` (``ProcessPool``'s children also get the pod's
``sys.path``).
"""

from __future__ import annotations

import os
import time

from leaseworker import ProcessContext


def checkpoints(pctx: ProcessContext, count: int) -> dict[str, float]:
    """Time ``count`` calls each of checkpoint(), owned and remaining(), and an empty loop."""
    figures: dict[str, float] = {}
    started = time.perf_counter()
    for _ in range(count):
        pass
    empty = time.perf_counter() - started
    for name, check in (
        ("checkpoint", pctx.checkpoint),
        ("owned", lambda: pctx.owned),
        ("remaining", pctx.remaining),
    ):
        started = time.perf_counter()
        for _ in range(count):
            check()
        figures[name] = (time.perf_counter() - started - empty) / count
    return figures


def nothing(_pctx: ProcessContext | None) -> None:
    """Return at once."""


def burn(_pctx: ProcessContext | None, seconds: float) -> float:
    """Burn ``seconds`` of this process's CPU time (not wall time: a busy machine stretches it)."""
    began = time.process_time()
    spent = 0.0
    while spent < seconds:
        spent = time.process_time() - began
    return spent


def pid_after(_pctx: ProcessContext | None, linger: float) -> int:
    """Return this worker's pid after ``linger`` seconds (so that concurrent calls spread)."""
    time.sleep(linger)
    return os.getpid()


def spin(_pctx: ProcessContext | None, started: str | None = None) -> None:
    """Compute until killed; first write this process's pid to ``started`` (a FIFO), if given."""
    if started is not None:
        descriptor = os.open(started, os.O_WRONLY)
        try:
            os.write(descriptor, f"{os.getpid()}\n".encode())
        finally:
            os.close(descriptor)
    while True:
        pass
