"""What both drawings show, computed once: lanes, the time axis, overlaps, step labels.

A :class:`Layout` puts a :class:`~leaseworker._history.History` on one time
axis: one lane per pod (a second lane when a pod ran two executions of a key
at once), the executions of each lane in start order, the intervals in which
two executions of one job key ran at once, and a human label for each step.
The text and the HTML renderer only turn it into characters or SVG.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from .._history import Execution, FaultWindow, History, Step

NICE_STEPS = (1, 2, 5)
"""Axis ticks fall on 1, 2 or 5 times a power of ten seconds."""


@dataclass(frozen=True, slots=True)
class Lane:
    """One row of the drawing: a pod (``index`` > 0 when it needed more than one row)."""

    pod: str
    index: int
    executions: tuple[Execution, ...]

    @property
    def label(self) -> str:
        """The lane's name: the pod, with ``#2``... for its extra rows."""
        return self.pod if self.index == 0 else f"{self.pod} #{self.index + 1}"


@dataclass(frozen=True, slots=True)
class Overlap:
    """An interval in which executions ``first`` and ``second`` of one job key both ran."""

    first: Execution
    second: Execution
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Layout:
    """A history placed on one axis from ``origin`` to ``until`` (seconds on its clock)."""

    history: History
    lanes: tuple[Lane, ...]
    origin: float
    until: float
    overlaps: tuple[Overlap, ...]

    @classmethod
    def of(cls, history: History) -> Layout:
        """Lay ``history`` out (an empty history gives an empty axis at 0)."""
        times = [t for e in history.executions for t in _times(e)]
        times += [t for f in history.faults for t in (f.start, f.end) if t is not None]
        origin = min(times, default=0.0)
        until = max(times, default=origin)
        return cls(
            history=history,
            lanes=_lanes(history.executions, until),
            origin=origin,
            until=until,
            overlaps=_overlaps(history, until),
        )

    @property
    def duration(self) -> float:
        """Seconds from the first to the last moment drawn."""
        return self.until - self.origin

    def end_of(self, execution: Execution) -> float:
        """Return where ``execution``'s bar ends: its end, or the axis end when unknown."""
        return execution.end if execution.end is not None else self.until

    def overlap_total(self) -> float:
        """Seconds in which at least two executions of one job key ran at once."""
        by_key: dict[str, list[tuple[float, float]]] = {}
        for overlap in self.overlaps:
            by_key.setdefault(overlap.first.job_key, []).append((overlap.start, overlap.end))
        return sum(_union_length(intervals) for intervals in by_key.values())

    def pods(self) -> list[str]:
        """Return the pods drawn, in lane order."""
        return list(dict.fromkeys(lane.pod for lane in self.lanes))

    def ticks(self, count: int) -> list[float]:
        """Return about ``count`` round tick positions, as seconds since ``origin``."""
        step = tick_step(self.duration, count)
        return [i * step for i in range(int(self.duration / step + 1e-9) + 1)]

    def faults(self) -> tuple[FaultWindow, ...]:
        """Return the faults drawn as a band, in start order."""
        return tuple(sorted(self.history.faults, key=lambda f: f.start))

    def summary(self) -> str:
        """Say what is drawn: ``timeline of KEY: 2 executions on 2 pods, from ... for ...``."""
        keys = self.history.keys()
        subject = keys[0] if len(keys) == 1 else f"{len(keys)} job keys"
        count, pods = len(self.history.executions), len(self.pods())
        return (
            f"timeline of {subject}: {count} execution{'s' * (count != 1)} on {pods} "
            f"pod{'s' * (pods != 1)}, from {self.started_at()} for {seconds(self.duration)}"
        )

    def offset(self, at: float) -> str:
        """Write moment ``at`` as the drawings do: seconds after the axis start, ``+1.234s``."""
        return f"+{at - self.origin:.3f}s"

    def started_at(self) -> str:
        """Say when the axis starts: a UTC time for Unix clocks, else the clock's reading."""
        if self.history.clock == "unix":
            moment = datetime.fromtimestamp(self.origin, UTC)
            return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"
        return f"monotonic {self.origin:.3f}s"

    def predecessor(self, execution: Execution) -> Execution | None:
        """Return the execution ``execution`` took the lease over from, when it is drawn."""
        wanted = execution.previous_execution_id
        if wanted is None:
            return None
        return next((e for e in self.history.executions if e.execution_id == wanted), None)


def tick_step(duration: float, count: int) -> float:
    """Return the smallest 1/2/5 x 10^n seconds that cut ``duration`` in ``count`` parts."""
    if duration <= 0 or count <= 0:
        return 1.0
    rough = duration / count
    power = 10.0 ** math.floor(math.log10(rough))
    for nice in (*NICE_STEPS, 10):
        if nice * power >= rough:
            return nice * power
    return 10 * power  # pragma: no cover - the loop always returns


def seconds(value: float) -> str:
    """Format a duration for people: ``850 ms``, ``2.35 s``, ``1 min 5.0 s``."""
    if value == 0:
        return "0 ms"
    if abs(value) < 1:
        return f"{value * 1000:.0f} ms" if abs(value) >= 0.0095 else f"{value * 1000:.1f} ms"
    if abs(value) < 60:
        return f"{value:.2f} s"
    minutes, rest = divmod(value, 60)
    return f"{minutes:.0f} min {rest:.1f} s"


LIFECYCLE = (
    "acquired",
    "renewed",
    "renew_failed",
    "lost",
    "cancel_requested",
    "stopped",
    "completion",
    "released",
    "release_failed",
    "committed",
    "dead_lettered",
    "effect_committed",
    "effect_sent",
    "effect_failed",
)
"""The order of steps that share a moment (to the millisecond)."""

EFFECT_STEPS = frozenset({"effect_committed", "effect_sent", "effect_failed"})
"""Steps of an execution's messages (docs/effects.md): committed, sent, a send that failed."""


def step_order(step: Step) -> tuple[float, int]:
    """Sort key of steps: by time, then in lifecycle order."""
    rank = LIFECYCLE.index(step.name) if step.name in LIFECYCLE else len(LIFECYCLE)
    return (round(step.at, 3), rank)


def describe(step: Step) -> tuple[str, str]:
    """Return a step's name and its details in words, e.g. ``("renew failed", "timeout ...")``."""
    attrs = step.attrs
    name = step.name.replace("_", " ")
    if step.name == "acquired":
        details = [f"fence {attrs['fence']}"] if "fence" in attrs else []
        if "wait_ms" in attrs:
            details.append(f"waited {attrs['wait_ms']} ms")
        if "previous_execution_id" in attrs:
            details.append(f"took the lease over from {str(attrs['previous_execution_id'])[:8]}")
        return name, ", ".join(details)
    if step.name in ("renewed", "renew_failed", "released", "release_failed"):
        outcome = attrs.get("reason", "")
        took = f"{step.duration * 1000:.1f} ms"
        return name, f"{outcome} after {took}" if outcome else took
    if step.name in ("lost", "cancel_requested"):
        return name, str(attrs.get("reason", ""))
    if step.name == "stopped":
        latency = attrs.get("latency_ms")
        return name, f"{latency} ms after the loss" if latency is not None else ""
    if step.name == "completion":
        return name, str(attrs.get("status", ""))
    if step.name == "committed":
        position = attrs.get("position")
        return name, f"offset committed (position {position})" if position is not None else ""
    if step.name in ("dead_lettered", *EFFECT_STEPS):
        return _other_words(step)
    return name, ", ".join(f"{k}={v}" for k, v in attrs.items())


def _other_words(step: Step) -> tuple[str, str]:
    """Describe a dead letter, or an effect: which message, where to, where it landed or why not."""
    attrs = step.attrs
    if step.name == "dead_lettered":
        return "dead-lettered", str(attrs.get("reason", ""))
    where = f" at {attrs['partition']}:{attrs['offset']}" if "offset" in attrs else ""
    failed = f" ({attrs['error']})" if "error" in attrs else ""
    topic = attrs.get("topic", "")
    return step.name.replace("_", " "), f"{attrs.get('effect_id', '')} to {topic}{where}{failed}"


def _times(execution: Execution) -> Iterator[float]:
    yield execution.start
    if execution.end is not None:
        yield execution.end
    for step in execution.steps:
        yield step.at
        yield step.at + step.duration


def _lanes(executions: tuple[Execution, ...], until: float) -> tuple[Lane, ...]:
    """One lane per pod in order of first appearance; a pod's overlapping runs get more rows."""
    rows: dict[str, list[list[Execution]]] = {}
    for execution in sorted(executions, key=lambda e: (e.start, e.execution_id)):
        pod_rows = rows.setdefault(execution.pod, [])
        for row in pod_rows:
            if not row[-1].overlaps(execution, until=until):
                row.append(execution)
                break
        else:
            pod_rows.append([execution])
    return tuple(
        Lane(pod, index, tuple(row))
        for pod, pod_rows in rows.items()
        for index, row in enumerate(pod_rows)
    )


def _overlaps(history: History, until: float) -> tuple[Overlap, ...]:
    found: list[Overlap] = []
    for first, second in history.overlapping(until=until):
        first_end = first.end if first.end is not None else until
        second_end = second.end if second.end is not None else until
        found.append(Overlap(first, second, second.start, min(first_end, second_end)))
    return tuple(found)


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, -math.inf
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total
