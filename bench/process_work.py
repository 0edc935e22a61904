"""The work the process benches send to child processes (importable by every pool's children).

Every function takes the call's context first, as ``run_in_process`` passes
it (a ``ProcessContext``); the baselines (``anyio.to_process``,
``ProcessPoolExecutor``) pass ``None`` there, so each side pickles the same
arguments and runs the same code. The benches put this directory on the
children's ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import time


def noop(_ctx: object) -> None:
    """Do nothing: what is left is the dispatch itself."""


def spin(_ctx: object, seconds: float) -> float:
    """Burn ``seconds`` of this process's CPU time (not wall time: a busy machine stretches it)."""
    began = time.process_time()
    spent = 0.0
    while spent < seconds:
        spent = time.process_time() - began
    return spent


def pid(_ctx: object, linger: float) -> int:
    """Return this worker's pid after ``linger`` seconds (so that concurrent calls spread)."""
    time.sleep(linger)
    return os.getpid()


def spin_forever(_ctx: object, started: str) -> None:
    """Tell ``started`` (a FIFO) this worker's pid, then burn CPU until killed."""
    descriptor = os.open(started, os.O_WRONLY)
    try:
        os.write(descriptor, f"{os.getpid()}\n".encode())
    finally:
        os.close(descriptor)
    while True:
        pass
