"""The campaign's pods run the user's job through this wrapper, to stall its event loop.

``leaseworker run leaseworker_dev._campaign._stall:StallingJob`` runs the class
named by ``LEASEWORKER_CHAOS_JOB`` (``pkg.module:JobClass``) unchanged, except
that a job starting (or ending) while the campaign has asked this pod for a
stall (a file ``<pod>.stall`` in ``LEASEWORKER_CHAOS_DIR``) first blocks the
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

from leaseworker.toolkit import FaultWindow, JobContext, ReportJob, record_line

JOB_VARIABLE = "LEASEWORKER_CHAOS_JOB"
DIR_VARIABLE = "LEASEWORKER_CHAOS_DIR"


def stall_request(directory: Path, pod: str) -> Path:
    """Return the file that asks ``pod`` for a stall."""
    return directory / f"{pod}.stall"


def stall_log(directory: Path, pod: str) -> Path:
    """Return the file where ``pod`` records the stalls it played."""
    return directory / f"{pod}.stalls.jsonl"


def maybe_stall(directory: Path, pod: str, where: str) -> None:
    """Play a pending stall request of ``pod`` meant for ``where`` (``start``/``end`` of a job).

    The request holds ``<seconds> <where>``: at the start, the job's first
    checkpoint finds the lease gone; at the end, after ``run()`` returned: a
    returned result is completed after the stall, when the completer or the
    store must refuse it, while a job that committed through
    ``ctx.transaction()`` is paused between its commit and its release.
    Blocks this thread (the event loop), then records the stall.
    """
    request = stall_request(directory, pod)
    try:
        seconds, wanted = request.read_text().split()
    except (FileNotFoundError, ValueError):
        return
    if wanted != where:
        return
    taken = request.with_suffix(f".taken-{os.getpid()}")
    try:
        request.rename(taken)  # atomic: one job takes the request
    except FileNotFoundError:
        return
    taken.unlink()
    start = time.monotonic()
    time.sleep(float(seconds))  # the fault itself: the event loop stops, renewals with it
    end = time.monotonic()
    fault = FaultWindow(kind="loop_stall", start=start, end=end, target=pod, attrs={"at": where})
    with stall_log(directory, pod).open("a", encoding="utf-8") as log:
        log.write(record_line(fault))


def _wrap(base: type[ReportJob], directory: Path) -> type[ReportJob]:
    async def run(self: ReportJob, ctx: JobContext) -> object:
        maybe_stall(directory, ctx.pod, "start")
        result = await base.run(self, ctx)
        maybe_stall(directory, ctx.pod, "end")
        return result

    namespace: dict[str, Any] = {"run": run, "__module__": __name__, "__doc__": base.__doc__}
    return type(base.__name__, (base,), namespace)


def __getattr__(name: str) -> Any:
    """``StallingJob``: the user's job class (from the environment), wrapped."""
    if name != "StallingJob":
        raise AttributeError(name)
    module_name, _, class_name = os.environ[JOB_VARIABLE].partition(":")
    base = getattr(importlib.import_module(module_name), class_name)
    return _wrap(base, Path(os.environ[DIR_VARIABLE]))
