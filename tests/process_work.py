"""Functions the tests run in ``run_in_process`` children (importable: a child unpickles them).

Each one that must be seen running writes its pid to ``marker`` first, so a
test waits for that file instead of sleeping, then reads the child's fate
from /proc by pid.
"""

from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path

from leaseworker import ProcessContext


def add(pctx: ProcessContext, a: int, b: int) -> int:
    """Return ``a + b``."""
    return a + b


def identity(pctx: ProcessContext) -> tuple[str, int, bool]:
    """Return what the child sees of its execution: job key, fence, ownership."""
    return pctx.job_key, pctx.fence, pctx.owned


def pid(pctx: ProcessContext) -> int:
    """Return the child's pid."""
    return os.getpid()


def execution(pctx: ProcessContext) -> str:
    """Return the execution id the child's call carries."""
    return pctx.execution_id


def spin(pctx: ProcessContext, marker: str) -> None:
    """Announce the pid, then burn CPU forever without ever looking at the lease."""
    Path(marker).write_text(str(os.getpid()))
    while True:
        pass


def spin_checking(pctx: ProcessContext, marker: str) -> None:
    """Announce the pid, then burn CPU, calling ``checkpoint()`` (LeaseLost once not owned)."""
    Path(marker).write_text(str(os.getpid()))
    while True:
        pctx.checkpoint()


def outlive(pctx: ProcessContext, seconds: float) -> float:
    """Burn CPU for ``seconds``; return the least ``remaining()`` seen (> 0: never lost)."""
    least = pctx.remaining()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pctx.checkpoint()
        least = min(least, pctx.remaining())
    return least


def crash(pctx: ProcessContext) -> None:
    """Die of SIGSEGV, as a broken C extension does."""
    ctypes.string_at(0)


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")
