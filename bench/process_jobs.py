"""Functions the process-pool benches run in a child (a module, so the child can import them)."""

from __future__ import annotations

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


def spin(pctx: ProcessContext) -> None:
    """Compute until killed."""
    while True:
        pass


def nothing(pctx: ProcessContext) -> None:
    """Return at once."""
