"""The campaign's pods run the user's job through this wrapper, to stall its event loop.

``leaseworker run leaseworker._campaign._stall:StallingJob`` runs the class
named by ``LEASEWORKER_CHAOS_JOB`` (``pkg.module:JobClass``) unchanged, except
that a job starting while the campaign has asked this pod for a stall (a file
``<pod>.stall`` in ``LEASEWORKER_CHAOS_DIR`` holding seconds) first blocks the
event loop for that long, as a job's synchronous call would. The stall is
recorded as a fault line in ``<pod>.stalls.jsonl`` beside it, on the monotonic
clock, so the checker knows which executions were frozen.
"""

from __future__ import annotations

import importlib
import os
import time
from pathlib import Path
from typing import Any

from .._execution import JobContext, ReportJob
from .._history import Fault, record_line

JOB_VARIABLE = "LEASEWORKER_CHAOS_JOB"
DIR_VARIABLE = "LEASEWORKER_CHAOS_DIR"


def stall_request(directory: Path, pod: str) -> Path:
    """Return the file that asks ``pod`` for a stall."""
    return directory / f"{pod}.stall"


def stall_log(directory: Path, pod: str) -> Path:
    """Return the file where ``pod`` records the stalls it played."""
    return directory / f"{pod}.stalls.jsonl"


def maybe_stall(directory: Path, pod: str) -> None:
    """Play a pending stall request of ``pod``: block this thread, then record it."""
    request = stall_request(directory, pod)
    taken = request.with_suffix(f".taken-{os.getpid()}")
    try:
        request.rename(taken)  # atomic: one job takes the request
    except FileNotFoundError:
        return
    seconds = float(taken.read_text() or 0)
    taken.unlink()
    start = time.monotonic()
    time.sleep(seconds)  # the fault itself: the event loop stops, renewals with it
    fault = Fault(kind="loop_stall", start=start, end=time.monotonic(), target=pod)
    with stall_log(directory, pod).open("a", encoding="utf-8") as log:
        log.write(record_line(fault))


def _wrap(base: type[ReportJob], directory: Path) -> type[ReportJob]:
    async def run(self: ReportJob, ctx: JobContext) -> object:
        maybe_stall(directory, ctx.pod)
        return await base.run(self, ctx)

    namespace: dict[str, Any] = {"run": run, "__module__": __name__, "__doc__": base.__doc__}
    return type(base.__name__, (base,), namespace)


def __getattr__(name: str) -> Any:
    """``StallingJob``: the user's job class (from the environment), wrapped."""
    if name != "StallingJob":
        raise AttributeError(name)
    module_name, _, class_name = os.environ[JOB_VARIABLE].partition(":")
    base = getattr(importlib.import_module(module_name), class_name)
    return _wrap(base, Path(os.environ[DIR_VARIABLE]))
