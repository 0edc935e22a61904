"""Recorded histories of job keys: executions, their steps and injected faults.

One data model for every view of "what happened to this key": the timeline
(``leaseworker timeline``) builds a :class:`History` from Jaeger traces, the
fault campaign (``leaseworker chaos``) from the pods' execution recorders, and
both draw and check it through the same code. Times are seconds on one clock
per history (``clock`` names it: ``"unix"`` for traces, ``"monotonic"`` for a
recorder on one machine). Only identifiers, fences and reason codes are kept:
never payloads or results. A history is a JSON document (:meth:`History.to_json`,
:meth:`History.from_json`) so one tool can write it and another read it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal

Scalar = str | int | float | bool
Clock = Literal["unix", "monotonic"]

FORMAT: Final = "leaseworker.history/1"
"""The ``format`` field of a history document; readers refuse any other."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One step inside an execution: a point (``duration`` 0) or an interval.

    ``name`` is a lifecycle word: ``acquired``, ``renewed``, ``renew_failed``,
    ``lost``, ``cancel_requested``, ``stopped``, ``completion``, ``committed``,
    ``dead_lettered``, ``released``. ``attrs`` holds its details (a loss's
    ``reason``, a completion's ``status``, a stop's ``latency_ms``).
    """

    at: float
    name: str
    duration: float = 0.0
    attrs: Mapping[str, Scalar] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Execution:
    """One execution of a job key: from acquiring its lease to letting it go.

    ``end`` is ``None`` while it runs (or when the record of its end is
    missing: a killed pod). ``completion`` is the store's answer
    (``accepted``/``duplicate``/``stale``) when it tried to complete;
    ``paused`` marks an execution whose pod was frozen (SIGSTOP) while it
    held the lease, which fencing, not the lease, protects.
    ``previous_execution_id`` names the execution whose lease this one took
    over (the acquisition before it), when that is known. ``cpu_seconds``:
    what its ``run_in_process`` children spent, killed ones included.
    """

    job_key: str
    execution_id: str
    pod: str
    start: float
    end: float | None = None
    fence: int | None = None
    input_version: str | None = None
    outcome: str | None = None
    reason: str | None = None
    completion: str | None = None
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    trace_id: str | None = None
    span_id: str | None = None
    paused: bool = False
    steps: tuple[Step, ...] = ()
    previous_execution_id: str | None = None
    cpu_seconds: float | None = None

    def overlaps(self, other: Execution, *, until: float) -> float:
        """Seconds this execution and ``other`` ran at once (an open end counts as ``until``)."""
        end = self.end if self.end is not None else until
        other_end = other.end if other.end is not None else until
        return max(0.0, min(end, other_end) - max(self.start, other.start))


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultWindow:
    """When an injected fault was on (campaign histories): its kind, target and window."""

    kind: str
    start: float
    end: float | None = None
    target: str | None = None
    attrs: Mapping[str, Scalar] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class History:
    """Executions (any keys, any pods) and faults on one clock."""

    clock: Clock = "unix"
    executions: tuple[Execution, ...] = ()
    faults: tuple[FaultWindow, ...] = ()

    def keys(self) -> list[str]:
        """List the job keys present, in order of their first execution."""
        seen: dict[str, None] = {}
        for execution in sorted(self.executions, key=lambda e: e.start):
            seen.setdefault(execution.job_key, None)
        return list(seen)

    def of_key(self, job_key: str) -> History:
        """Select the executions of one key (faults are kept: they are not per key)."""
        executions = tuple(e for e in self.executions if e.job_key == job_key)
        return History(clock=self.clock, executions=executions, faults=self.faults)

    @property
    def end(self) -> float:
        """The latest moment it shows: an execution's end (or start, if open) or a fault's."""
        times = [e.end if e.end is not None else e.start for e in self.executions]
        times += [f.end if f.end is not None else f.start for f in self.faults]
        return max(times, default=0.0)

    def overlapping(self, *, until: float | None = None) -> list[tuple[Execution, Execution]]:
        """Pairs (earlier, later) of executions of one job key that held it at once.

        The one overlap judgement the checker, the timeline, the demo and the
        tests share; an open end counts as ``until`` (default :attr:`end`).
        Pairs come in start order (ties by execution id).
        """
        until = self.end if until is None else until
        ordered = sorted(self.executions, key=lambda e: (e.start, e.execution_id))
        pairs = []
        for i, first in enumerate(ordered):
            end = first.end if first.end is not None else until
            for second in ordered[i + 1 :]:
                if second.start >= end:
                    break
                if second.job_key == first.job_key and first.overlaps(second, until=until) > 0:
                    pairs.append((first, second))
        return pairs

    def to_json(self) -> str:
        """Write this history as one JSON document (``format`` first)."""
        document = {
            "format": FORMAT,
            "clock": self.clock,
            "executions": [asdict(e) for e in self.executions],
            "faults": [asdict(f) for f in self.faults],
        }
        return json.dumps(document, separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> History:
        """Read a document (:meth:`to_json`) or a record file; ``ValueError`` says what is wrong.

        A record file is :func:`header_line` followed by :func:`record_line` lines;
        a later line of an execution (same ``execution_id``) replaces an earlier
        one, so a recorder can write a start line and then the ended execution,
        and an execution whose pod was killed still shows, open-ended.
        """
        try:
            document = json.loads(text)
        except json.JSONDecodeError:
            document = _from_lines(text)
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} document")
        clock = document.get("clock")
        if clock not in ("unix", "monotonic"):
            raise ValueError(f"unknown clock {clock!r}")
        try:
            executions = tuple(_execution(e) for e in document.get("executions", ()))
            faults = tuple(FaultWindow(**f) for f in document.get("faults", ()))
        except TypeError as exc:
            raise ValueError(f"malformed history: {exc}") from None
        return cls(clock=clock, executions=executions, faults=faults)


def header_line(clock: Clock) -> str:
    """Start a record file: a recorder appends :func:`record_line` lines after this one."""
    return json.dumps({"format": FORMAT, "clock": clock}) + "\n"


def record_line(item: Execution | FaultWindow) -> str:
    """One line of a record file: an execution (started or ended) or a fault, as it happened."""
    kind = "execution" if isinstance(item, Execution) else "fault"
    return json.dumps({kind: asdict(item)}, separators=(",", ":"), allow_nan=False) + "\n"


def merge(histories: Iterable[History]) -> History:
    """One history of several on the same clock (a recorder file per pod, say)."""
    parts = list(histories)
    clocks = {h.clock for h in parts}
    if len(clocks) > 1:
        raise ValueError(f"cannot merge histories on different clocks: {sorted(clocks)}")
    return History(
        clock=clocks.pop() if clocks else "unix",
        executions=tuple(e for h in parts for e in h.executions),
        faults=tuple(f for h in parts for f in h.faults),
    )


def _from_lines(text: str) -> dict[str, Any]:
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not lines or not isinstance(lines[0], dict):
        raise ValueError(f"not a {FORMAT} document")
    document: dict[str, Any] = {**lines[0], "executions": [], "faults": []}
    executions: dict[object, Any] = {}
    for line in lines[1:]:
        if "fault" in line:
            document["faults"].append(line["fault"])
        if "execution" in line:
            raw = line["execution"]
            executions[raw.get("execution_id") if isinstance(raw, dict) else id(raw)] = raw
    document["executions"] = list(executions.values())
    return document


def _execution(raw: Mapping[str, Any]) -> Execution:
    steps = tuple(Step(**s) for s in raw.get("steps", ()))
    return Execution(**{**raw, "steps": steps})


__all__ = [
    "FORMAT",
    "Clock",
    "Execution",
    "FaultWindow",
    "History",
    "Scalar",
    "Step",
    "header_line",
    "merge",
    "record_line",
]
