"""The timeline as text for a terminal: lanes of characters on one axis, then the steps.

Every mark is a distinct character (the legend line names them), so the
drawing reads the same without colour; ``color=True`` only adds ANSI colours
(the overlap in magenta, losses in red). Lines never exceed ``width``.
"""

from __future__ import annotations

from collections.abc import Iterable

from .._history import Execution, History, Step
from ._layout import EFFECT_STEPS, Layout, describe, seconds, step_order, tick_step

LABEL = 10
"""Columns of the lane names (a longer pod name is cut)."""

MARKS: dict[str, tuple[str, int]] = {
    "renewed": ("r", 2),
    "renew_failed": ("?", 5),
    "lost": ("!", 7),
    "stopped": ("x", 6),
    "committed": ("c", 2),
    "dead_lettered": ("D", 4),
    "effect_committed": ("e", 3),
    "effect_sent": ("m", 3),
    "effect_failed": ("f", 3),
}
"""A step's character in its lane, and its priority when two share a column."""

COMPLETION_MARKS = {"accepted": "a", "duplicate": "d", "stale": "s"}

LEGEND = (
    "[ acquired  = holds the lease  r renewed  ? renewal failed  ! lost  x stopped  ] released"
    "  ~ release after the stop  > no end seen  a/d/s completion accepted/duplicate/stale"
    "  c offset committed  D dead-lettered  ^ overlap  # fault"
)
EFFECT_LEGEND = "  e effect committed  m effect sent (the broker has it)  f send failed"
"""Added to the legend when the history shows effects (docs/effects.md)."""

_ANSI = {
    "!": "1;31",
    "x": "31",
    "?": "33",
    "s": "31",
    "d": "36",
    "a": "32",
    "^": "1;35",
    "#": "33",
}
_OUTCOME_ANSI = {"completed": "32", "duplicate": "36", "lost": "31"}


def render_text(history: History, *, width: int = 100, color: bool = False) -> str:
    """Draw ``history`` in at most ``width`` columns; ANSI colour only when ``color``."""
    width = max(width, LABEL + 20)
    layout = Layout.of(history)
    lines = _header(layout)
    if not layout.lanes and not layout.history.faults:
        return "\n".join(lines) + "\n"
    plot = _Plot(layout, width - LABEL - 1, color=color)
    lines += plot.axis()
    lines += [plot.lane_line(lane.label, lane.executions) for lane in layout.lanes]
    lines.append(plot.overlap_line())
    if layout.history.faults:
        lines.append(plot.fault_line())
    effects = any(s.name in EFFECT_STEPS for e in history.executions for s in e.steps)
    lines += _wrap("legend: " + LEGEND + EFFECT_LEGEND * effects, width)
    lines.append("")
    for execution in sorted(history.executions, key=lambda e: (e.start, e.execution_id)):
        lines += _details(layout, execution, width)
    for fault in layout.faults():
        end = f"..{layout.offset(fault.end)}" if fault.end is not None else " (no end)"
        target = f" on {fault.target}" if fault.target else ""
        lines.append(_cut(f"fault {fault.kind}{target}: {layout.offset(fault.start)}{end}", width))
    return "\n".join(line.rstrip() for line in lines) + "\n"


class _Cells:
    """One row of the plot: a character, its priority and its colour per column."""

    def __init__(self, columns: int) -> None:
        self.cells: list[tuple[str, int, str]] = [(" ", 0, "")] * columns

    def put(self, col: int, char: str, priority: int, ansi: str = "") -> None:
        if priority >= self.cells[col][1]:
            self.cells[col] = (char, priority, ansi or _ANSI.get(char, ""))

    def mark(self, col: int, char: str, priority: int) -> None:
        """Put a step's mark; one whose column another mark took moves up to 2 columns right."""
        for shifted in (col, col + 1, col + 2):
            if shifted < len(self.cells) and self.cells[shifted][1] < 2:
                self.put(shifted, char, priority)
                return
        self.put(col, char, priority)


class _Plot:
    """Maps times to columns of the plot area and draws its rows."""

    def __init__(self, layout: Layout, columns: int, *, color: bool) -> None:
        self._layout = layout
        self._columns = columns
        self._color = color

    def column(self, at: float) -> int:
        duration = self._layout.duration
        if duration <= 0:
            return 0
        fraction = (at - self._layout.origin) / duration
        return min(self._columns - 1, max(0, round(fraction * (self._columns - 1))))

    def axis(self) -> list[str]:
        step = tick_step(self._layout.duration, max(1, self._columns // 10))
        labels, marks = [" "] * self._columns, [" "] * self._columns
        free = 0
        for offset in self._layout.ticks(max(1, self._columns // 10)):
            col = self.column(self._layout.origin + offset)
            marks[col] = "|"
            text = _tick(offset, step)
            if col >= free and col + len(text) <= self._columns:
                labels[col : col + len(text)] = text
                free = col + len(text) + 1
        return [" " * (LABEL + 1) + "".join(labels), " " * (LABEL + 1) + "".join(marks)]

    def lane_line(self, label: str, executions: Iterable[Execution]) -> str:
        cells = _Cells(self._columns)
        for execution in executions:
            self._bar(cells, execution)
        for execution in executions:  # marks last: they shift right of one another
            marks = [(m, step) for step in execution.steps if (m := _mark(step)) is not None]
            for (char, priority), step in sorted(marks, key=lambda m: -m[0][1]):
                cells.mark(self.column(step.at), char, priority)
        return f"{label[:LABEL]:<{LABEL}} " + self._join(cells.cells)

    def _bar(self, cells: _Cells, execution: Execution) -> None:
        """Draw ``[===]`` from start to end, ``~`` for a release after the end."""
        body = _OUTCOME_ANSI.get(execution.outcome or "", "")
        first = self.column(execution.start)
        last = self.column(self._layout.end_of(execution))
        for step in execution.steps:
            tail = step.at + step.duration
            if step.name in ("released", "release_failed"):
                for col in range(last + 1, self.column(tail) + 1):
                    cells.put(col, "~", 1)
        if execution.fence is None and execution.end == execution.start:
            return  # never held the lease: only its marks
        last = min(self._columns - 1, max(last, first + 1))
        for col in range(first, last + 1):
            cells.put(col, "=", 1, body)
        cells.put(first, "[", 1, body)
        cells.put(last, "]" if execution.end is not None else ">", 1, body)

    def overlap_line(self) -> str:
        cells: list[tuple[str, int, str]] = [(" ", 0, "")] * self._columns
        for overlap in self._layout.overlaps:
            for col in range(self.column(overlap.start), self.column(overlap.end) + 1):
                cells[col] = ("^", 1, _ANSI["^"])
        return f"{'overlap':<{LABEL}} " + self._join(cells)

    def fault_line(self) -> str:
        cells: list[tuple[str, int, str]] = [(" ", 0, "")] * self._columns
        for fault in self._layout.faults():
            end = fault.end if fault.end is not None else self._layout.until
            for col in range(self.column(fault.start), self.column(end) + 1):
                cells[col] = ("#", 1, _ANSI["#"])
        return f"{'faults':<{LABEL}} " + self._join(cells)

    def _join(self, cells: list[tuple[str, int, str]]) -> str:
        if not self._color:
            return "".join(char for char, _, _ in cells)
        return "".join(f"\x1b[{ansi}m{char}\x1b[0m" if ansi else char for char, _, ansi in cells)


def _header(layout: Layout) -> list[str]:
    lines = [layout.summary()]
    total = layout.overlap_total()
    verdict = "no two executions of one key ran at once" if total == 0 else "EXECUTIONS OVERLAPPED"
    lines.append(f"overlap: {seconds(total)} ({verdict})")
    lines.append("")
    return lines


def _details(layout: Layout, execution: Execution, width: int) -> list[str]:
    outcome = execution.outcome or "unknown"
    if execution.reason:
        outcome += f" ({execution.reason})"
    head = [
        f"{execution.pod}",
        f"execution {execution.execution_id[:8]}",
        f"fence {execution.fence}" if execution.fence is not None else "no fence",
        outcome,
    ]
    if execution.completion:
        head.append(f"store: {execution.completion}")
    if execution.offset is not None:
        head.append(f"offset {execution.partition}:{execution.offset}")
    if execution.paused:
        head.append("paused")
    if execution.cpu_seconds is not None:
        head.append(f"child CPU {execution.cpu_seconds:.3f}s")
    lines = [_cut("  ".join(head), width)]
    for step in sorted(execution.steps, key=step_order):
        name, details = describe(step)
        lines.append(_cut(f"  {layout.offset(step.at):>9}  {name:<17} {details}", width))
    return lines


def _mark(step: Step) -> tuple[str, int] | None:
    if step.name == "completion":
        char = COMPLETION_MARKS.get(str(step.attrs.get("status", "")))
        return (char, 4) if char else None
    return MARKS.get(step.name)


def _tick(offset: float, step: float) -> str:
    return f"{offset * 1000:.0f}ms" if step < 0.1 else f"{round(offset, 1):g}s"


def _cut(line: str, width: int) -> str:
    return line if len(line) <= width else line[: width - 1] + "…"


def _wrap(text: str, width: int) -> list[str]:
    """Break ``text`` at double spaces (between legend entries) to fit ``width``."""
    lines: list[str] = []
    current = ""
    for part in text.split("  "):
        candidate = f"{current}  {part}" if current else part
        if len(candidate) > width and current:
            lines.append(current)
            current = "        " + part
        else:
            current = candidate
    lines.append(current)
    return lines
