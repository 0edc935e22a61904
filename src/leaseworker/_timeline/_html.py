"""The timeline as a self-contained HTML page: inline SVG, inline style and script, no network.

One lane per pod, each execution a bar (coloured by outcome) with a mark per
step; overlaps between executions of one key are drawn across the lanes in
their own colour, faults as a band, a takeover as a dashed line from the
predecessor's end. Hovering a bar or a mark shows its attributes (the SVG
``<title>`` tooltip and a details panel); below the drawing, every step in a table.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterator, Mapping

from .._history import Execution, History, Scalar, Step
from ._layout import EFFECT_STEPS, Lane, Layout, describe, seconds, step_order, tick_step

PLOT = 1000
"""Width of the time axis in pixels."""
LABEL = 130
RIGHT = 50
"""Room right of the axis for the last tick's label and an overlap's length."""
LANE = 44
BAR = 20
TOP = 34

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1d2330;background:#fff}
h1{font-size:18px;margin:0 0 4px}
.summary{margin:0 0 2px}
.overlap-total{margin:0 0 12px;font-weight:600}
.overlap-total.bad{color:#b0127a}
svg{display:block;border:1px solid #d8dce5;background:#fafbfd}
.axis line{stroke:#d8dce5}
.axis text,.lane-label{font-size:12px;fill:#4a5266}
.lane-bg{fill:#fff}
.lane:nth-child(even) .lane-bg{fill:#f3f5f9}
.bar{fill:#8a93a8;stroke:#404859;stroke-width:1}
.bar.outcome-completed{fill:#5bb374}
.bar.outcome-duplicate{fill:#62a8d6}
.bar.outcome-lost{fill:#e27a6c}
.bar.outcome-failed,.bar.outcome-timed_out{fill:#e0a84e}
.bar.paused{fill-opacity:.55;stroke-dasharray:4 2}
.tail{fill:none;stroke:#404859;stroke-width:2;stroke-dasharray:3 3}
.step{cursor:pointer}
.step-renewed line{stroke:#1d2330;stroke-width:1.5}
.step-renew_failed rect{fill:#f0a020;fill-opacity:.8;stroke:#b06e00}
.mark-label{font-size:11px;fill:#c0221a}
.step-lost path{fill:#c0221a}
.step-stopped path{stroke:#1d2330;stroke-width:2.5}
.step-completion circle{stroke:#1d2330;stroke-width:1}
.status-accepted circle{fill:#2e8b4a}
.status-duplicate circle{fill:#2a7fc0}
.status-stale circle{fill:#c0221a}
.step-committed rect{fill:#1d2330}
.step-dead_lettered rect{fill:#7a2a9a}
.step-effect_committed path{fill:#2e8b4a}
.step-effect_sent path{fill:#2a7fc0}
.step-effect_failed path{fill:#c0221a}
.overlap{fill:#d6249f;stroke:#b0127a;stroke-width:1.5}
.overlap-across{fill:#d6249f;fill-opacity:.12;stroke:#d6249f;stroke-dasharray:3 3}
.overlap-label{font-size:12px;font-weight:600;fill:#b0127a}
.overlap-label.inside{fill:#fff}
.overlap-none{font-size:12px;fill:#2e8b4a}
.fault{fill:#f0c43c;fill-opacity:.45;stroke:#b08a00}
.fault-label{font-size:11px;fill:#6b5400}
.takeover{fill:none;stroke:#4a5266;stroke-width:1.5;stroke-dasharray:5 3}
.bar:hover,.step:hover,.overlap:hover,.fault:hover{stroke:#000;stroke-width:2.5}
#details{margin:10px 0;padding:8px 10px;border:1px solid #d8dce5;background:#fafbfd;
white-space:pre-wrap;font:12px/1.4 ui-monospace,monospace;min-height:3em}
table{border-collapse:collapse;font-size:13px;margin-top:8px}
td,th{padding:2px 10px 2px 0;text-align:left;vertical-align:top}
th{border-bottom:1px solid #d8dce5}
.legend{font-size:12px;color:#4a5266}
"""

_SCRIPT = """
(function(){
  var panel=document.getElementById('details');
  function show(el){
    var a=JSON.parse(el.getAttribute('data-attrs'));
    panel.textContent=Object.keys(a).map(function(k){return k+': '+a[k];}).join('\\n');
  }
  document.querySelectorAll('[data-attrs]').forEach(function(el){
    el.addEventListener('mouseenter',function(){show(el);});
    el.addEventListener('click',function(){show(el);});
  });
})();
"""


def render_html(history: History, *, title: str = "leaseworker timeline") -> str:
    """Draw ``history`` as a page with no network references."""
    layout = Layout.of(history)
    svg = "\n".join(_Svg(layout).elements())
    total = layout.overlap_total()
    overlap_class = "overlap-total bad" if total > 0 else "overlap-total"
    verdict = "no two executions of one key ran at once" if total == 0 else "executions overlapped"
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
        f"<title>{_e(title)}</title>\n<style>{_STYLE}</style></head><body>\n"
        f"<h1>{_e(title)}</h1>\n"
        f'<p class="summary">{_e(layout.summary())}</p>\n'
        f'<p class="{overlap_class}" data-overlap-ms="{total * 1000:.1f}">'
        f"overlap: {_e(seconds(total))} ({verdict})</p>\n"
        f"{svg}\n"
        '<p class="legend">bars: from acquiring the lease to letting it go (a lost execution: '
        "until its job stopped; dashed: the release after it). Marks: | renewed, "
        "orange: a renewal that failed (from sending it to the verdict), ◆ lost, "
        "✕ stopped, ● completion (green accepted, blue duplicate, red stale), "
        "■ offset committed, ▼ effect committed (green), sent (blue), send failed (red). "
        "Pink: overlap. Yellow: fault. "
        "Dashed line: takeover of the lease. Hover for attributes.</p>\n"
        '<div id="details">hover a bar or a mark for its attributes</div>\n'
        f"{_table(layout)}\n<script>{_SCRIPT}</script>\n</body></html>\n"
    )


class _Svg:
    """The drawing: axis, lanes with bars and marks, faults, overlaps, takeovers."""

    def __init__(self, layout: Layout) -> None:
        self._layout = layout
        self._rows = len(layout.lanes) + 1 + (1 if layout.history.faults else 0)
        self._height = TOP + max(1, self._rows) * LANE + 10

    def x(self, at: float) -> float:
        duration = self._layout.duration
        fraction = 0.0 if duration <= 0 else (at - self._layout.origin) / duration
        return round(LABEL + 10 + fraction * (PLOT - 20), 1)

    def elements(self) -> Iterator[str]:
        width = LABEL + PLOT + RIGHT
        yield (
            f'<svg id="timeline" class="timeline" xmlns="http://www.w3.org/2000/svg" '
            f'width="{width}" height="{self._height}" viewBox="0 0 {width} {self._height}">'
        )
        yield from self._axis()
        yield '<g class="lanes">'
        for row, lane in enumerate(self._layout.lanes):
            yield from self._lane(row, lane)
        yield "</g>"
        yield from self._overlaps(len(self._layout.lanes))
        if self._layout.history.faults:
            yield from self._faults(len(self._layout.lanes) + 1)
        yield from self._takeovers()
        yield "</svg>"

    def _axis(self) -> Iterator[str]:
        step = tick_step(self._layout.duration, 10)
        yield '<g class="axis">'
        for offset in self._layout.ticks(10):
            x = self.x(self._layout.origin + offset)
            label = f"{offset * 1000:.0f} ms" if step < 0.1 else f"{round(offset, 1):g} s"
            yield f'<line x1="{x}" y1="{TOP - 6}" x2="{x}" y2="{self._height - 4}"/>'
            yield f'<text x="{x}" y="{TOP - 12}" text-anchor="middle">{label}</text>'
        yield "</g>"

    def _lane(self, row: int, lane: Lane) -> Iterator[str]:
        y = TOP + row * LANE
        yield f'<g class="lane" data-pod="{_e(lane.pod)}">'
        width = LABEL + PLOT + RIGHT
        yield f'<rect class="lane-bg" x="0" y="{y}" width="{width}" height="{LANE}"/>'
        yield f'<text class="lane-label" x="8" y="{y + LANE / 2 + 4}">{_e(lane.label)}</text>'
        for execution in lane.executions:
            yield from self._execution(execution, y + (LANE - BAR) / 2)
        yield "</g>"

    def _execution(self, execution: Execution, y: float) -> Iterator[str]:
        x1, x2 = self.x(execution.start), self.x(self._layout.end_of(execution))
        classes = f"bar outcome-{_e(execution.outcome or 'unknown')}"
        if execution.paused:
            classes += " paused"
        attrs = _execution_attrs(self._layout, execution)
        yield f'<g class="execution" data-execution="{_e(execution.execution_id)}">'
        for step in execution.steps:  # the release after a stop: a dashed tail
            tail = step.at + step.duration
            if step.name in ("released", "release_failed") and tail > self._layout.end_of(
                execution
            ):
                yield (
                    f'<line class="tail" x1="{x2}" y1="{y + BAR / 2}" '
                    f'x2="{self.x(tail)}" y2="{y + BAR / 2}"/>'
                )
        yield (
            f'<rect class="{classes}" x="{x1}" y="{y}" width="{max(2.0, x2 - x1):.1f}" '
            f'height="{BAR}" rx="3" data-attrs="{_json(attrs)}"><title>{_tip(attrs)}</title></rect>'
        )
        for step in execution.steps:
            yield from self._step(execution, step, y)
        yield "</g>"

    def _step(self, execution: Execution, step: Step, y: float) -> Iterator[str]:
        x = self.x(step.at)
        shape = _shape(step, x, y, self.x(step.at + step.duration))
        if shape is None:
            return
        name, details = describe(step)
        attrs: dict[str, Scalar] = {
            "step": name,
            "at": self._layout.offset(step.at),
            **({"details": details} if details else {}),
            **({"duration": seconds(step.duration)} if step.duration else {}),
            "pod": execution.pod,
            "execution": execution.execution_id,
            **dict(step.attrs),
        }
        status = (
            f" status-{_e(str(step.attrs.get('status', '')))}" if "status" in step.attrs else ""
        )
        yield (
            f'<g class="step step-{_e(step.name)}{status}" data-attrs="{_json(attrs)}">'
            f"<title>{_tip(attrs)}</title>{shape}</g>"
        )

    def _faults(self, row: int) -> Iterator[str]:
        y = TOP + row * LANE
        yield '<g class="faults">'
        yield f'<text class="lane-label" x="8" y="{y + LANE / 2 + 4}">faults</text>'
        for fault in self._layout.faults():
            end = fault.end if fault.end is not None else self._layout.until
            x1, x2 = self.x(fault.start), self.x(end)
            attrs: dict[str, Scalar] = {
                "fault": fault.kind,
                "start": self._layout.offset(fault.start),
                "end": self._layout.offset(end) if fault.end is not None else "none",
                **({"target": fault.target} if fault.target else {}),
                **dict(fault.attrs),
            }
            yield (
                f'<rect class="fault" x="{x1}" y="{y + 6}" width="{max(2.0, x2 - x1):.1f}" '
                f'height="{LANE - 12}" data-attrs="{_json(attrs)}"><title>{_tip(attrs)}</title>'
                "</rect>"
            )
            label = fault.kind + (f" {fault.target}" if fault.target else "")
            at = f'x="{x1 + 3}" y="{y + LANE / 2 + 4}"'
            yield f'<text class="fault-label" {at}>{_e(label)}</text>'
        yield "</g>"

    def _overlaps(self, row: int) -> Iterator[str]:
        """Draw the overlap row (a band per overlap) and a light mark across the lanes."""
        y = TOP + row * LANE
        lanes = len(self._layout.lanes)
        total = self._layout.overlap_total()
        yield f'<g class="overlaps" data-overlap-ms="{total * 1000:.1f}">'
        yield f'<text class="lane-label" x="8" y="{y + LANE / 2 + 4}">overlap</text>'
        if not self._layout.overlaps:
            at = f'x="{LABEL + 10}" y="{y + LANE / 2 + 4}"'
            yield f'<text class="overlap-none" {at}>none: 0 ms</text>'
        for overlap in self._layout.overlaps:
            x1, x2 = self.x(overlap.start), self.x(overlap.end)
            width = max(3.0, x2 - x1)
            attrs: dict[str, Scalar] = {
                "overlap": seconds(overlap.end - overlap.start),
                "job key": overlap.first.job_key,
                "first": f"{overlap.first.pod} {overlap.first.execution_id}",
                "second": f"{overlap.second.pod} {overlap.second.execution_id}",
            }
            tip = f'data-attrs="{_json(attrs)}"><title>{_tip(attrs)}</title>'
            yield (
                f'<rect class="overlap-across" x="{x1}" y="{TOP}" width="{width:.1f}" '
                f'height="{lanes * LANE}"/>'
            )
            yield (
                f'<rect class="overlap" x="{x1}" y="{y + 8}" width="{width:.1f}" '
                f'height="{LANE - 16}" {tip}</rect>'
            )
            inside = width > 70  # the length in the band, else beside it
            at = f'x="{x1 + 6 if inside else x1 + width + 4}" y="{y + LANE / 2 + 4}"'
            kind = "overlap-label inside" if inside else "overlap-label"
            yield f'<text class="{kind}" {at}>{_e(str(attrs["overlap"]))}</text>'
        yield "</g>"

    def _takeovers(self) -> Iterator[str]:
        rows = {
            e.execution_id: r for r, lane in enumerate(self._layout.lanes) for e in lane.executions
        }
        yield '<g class="takeovers">'
        for execution in self._layout.history.executions:
            previous = self._layout.predecessor(execution)
            if previous is None:
                continue
            y1 = TOP + rows[previous.execution_id] * LANE + LANE / 2
            y2 = TOP + rows[execution.execution_id] * LANE + LANE / 2
            handover = min(self._layout.end_of(previous), execution.start)  # or overlapped
            x1, x2 = self.x(handover), self.x(execution.start)
            yield (
                f'<path class="takeover" d="M{x1},{y1} C{(x1 + x2) / 2},{y1} '
                f'{(x1 + x2) / 2},{y2} {x2},{y2}"><title>took the lease over from '
                f"{_e(previous.pod)} {_e(previous.execution_id)}</title></path>"
            )
        yield "</g>"


def _shape(step: Step, x: float, y: float, x_end: float) -> str | None:
    """Return the SVG of a step's mark at ``x`` on a bar at ``y`` (``x_end``: its end)."""
    mid = y + BAR / 2
    if step.name == "renewed":  # a thin line, with a wider invisible target for the hover
        return (
            f'<line x1="{x}" y1="{y + 3}" x2="{x}" y2="{y + BAR - 3}"/>'
            f'<rect x="{x - 3}" y="{y}" width="6" height="{BAR}" fill="transparent"/>'
        )
    if step.name == "renew_failed":  # from sending it to the verdict
        width = max(3.0, x_end - x)
        return f'<rect x="{x}" y="{y - 3}" width="{width:.1f}" height="{BAR + 6}"/>'
    if step.name == "lost":
        reason = _e(str(step.attrs.get("reason", "")))
        return (
            f'<path d="M{x},{mid - 9} L{x + 7},{mid} L{x},{mid + 9} L{x - 7},{mid} Z"/>'
            f'<text class="mark-label" x="{x + 9}" y="{y + BAR + 11}">lost: {reason}</text>'
        )
    if step.name == "stopped":
        cross = f"M{x - 5},{mid - 5} L{x + 5},{mid + 5} M{x - 5},{mid + 5} L{x + 5},{mid - 5}"
        return f'<path d="{cross}"/>'
    if step.name == "completion":
        return f'<circle cx="{x}" cy="{y - 5}" r="5"/>'
    if step.name in ("committed", "dead_lettered"):
        return f'<rect x="{x - 4}" y="{y + BAR + 1}" width="8" height="8"/>'
    if step.name in EFFECT_STEPS:  # a triangle above the bar: the message left (or tried to)
        return f'<path d="M{x - 5},{y - 12} L{x + 5},{y - 12} L{x},{y - 4} Z"/>'
    return None


def _execution_attrs(layout: Layout, execution: Execution) -> dict[str, Scalar]:
    fields: dict[str, Scalar | None] = {
        "job key": execution.job_key,
        "pod": execution.pod,
        "execution": execution.execution_id,
        "fence": execution.fence,
        "outcome": execution.outcome,
        "loss reason": execution.reason,
        "completion": execution.completion,
        "held": seconds(layout.end_of(execution) - execution.start),
        "start": layout.offset(execution.start),
        "end": layout.offset(execution.end) if execution.end is not None else None,
        "topic": execution.topic,
        "partition": execution.partition,
        "offset": execution.offset,
        "trace": execution.trace_id,
        "took over from": execution.previous_execution_id,
        "paused": True if execution.paused else None,
    }
    return {k: v for k, v in fields.items() if v is not None}


def _table(layout: Layout) -> str:
    rows = [
        "<table><tr><th>at</th><th>pod</th><th>execution</th><th>step</th><th>details</th></tr>"
    ]
    for execution in sorted(layout.history.executions, key=lambda e: e.start):
        for step in sorted(execution.steps, key=step_order):
            name, details = describe(step)
            rows.append(
                f"<tr><td>{layout.offset(step.at)}</td><td>{_e(execution.pod)}</td>"
                f"<td>{_e(execution.execution_id[:8])}</td><td>{_e(name)}</td>"
                f"<td>{_e(details)}</td></tr>"
            )
    rows.append("</table>")
    return "\n".join(rows)


def _tip(attrs: Mapping[str, Scalar]) -> str:
    return _e("\n".join(f"{k}: {v}" for k, v in attrs.items()))


def _json(attrs: Mapping[str, Scalar]) -> str:
    return _e(json.dumps(dict(attrs), separators=(",", ":")))


def _e(text: str) -> str:
    return html.escape(text, quote=True)
