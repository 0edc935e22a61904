"""Child spans made in one step, handed to the pod's own export pipeline as plain tuples.

Most spans of a trigger are made once what they describe is over (``trigger
received``, ``lease acquire``, ``job run``, ``completion``, ``lease
release``, ``commit``): a span object would be started, filled, ended and
then only read by the exporter. When every span processor of a
:class:`~._lean.LeanTracerProvider` takes records (``leaseworker run``: the
lean batch processor with the OTLP/JSON exporter), such a span is one
:data:`Record` instead: no span object, context or attribute view made on the
event loop, nothing more for the garbage collector to traverse while it waits
for its export, and the same OTLP span once encoded in the export thread (ids
from the provider's id generator, attributes, events, links, status). With
any other provider, processor or span limits, :func:`end_child` makes the
span through the tracer API, so every processor sees a real span.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from opentelemetry.trace import Link, SpanKind, Status, TraceFlags, Tracer

from . import _export_seam
from ._export_seam import Fields
from ._trace import Attributes, TriggerTrace

if TYPE_CHECKING:  # the SDK is optional: only a lean provider (which needs it) makes records
    from opentelemetry.sdk.trace import SpanLimits

    from ._lean import LeanTracer

_LEAN = f"{__package__}._lean"

Record = tuple[Any, ...]
"""``(origin, name, trace id, span id, parent span id, trace flags, trace state, kind,
start ns, end ns, attributes, status or None, events, links, shared attributes or None)``;
``origin`` is ``(resource, scope)``, an event ``(name, attributes, time ns)``. The
span's attributes are the shared ones (its trace's :meth:`~TriggerTrace.shared`: one
dict for all of a trigger's spans, encoded once per export) followed by its own."""

ORIGIN, NAME, TRACE_ID, SPAN_ID, PARENT_ID, FLAGS, STATE, KIND = range(8)
START, END, ATTRIBUTES, STATUS, EVENTS, LINKS, SHARED = range(8, 15)

Event = tuple[str, Attributes, int]

_ENOUGH = 64
"""Attributes, events (``MAX_ACQUIRE_EVENTS``) and links a record may carry, at most."""

_SAMPLED = int(TraceFlags.SAMPLED)


class RecordTaker(Protocol):
    """A span processor that takes records (``takes_records``): the lean batch processor."""

    def take(self, span: Record) -> None:
        """Queue a span record for export."""


def fit(limits: SpanLimits) -> bool:
    """Whether ``limits`` leave a record as it is: nothing to truncate or drop."""
    counts = (
        limits.max_span_attributes,
        limits.max_events,
        limits.max_links,
        limits.max_event_attributes,
    )
    return limits.max_span_attribute_length is None and all(
        count is None or count >= _ENOUGH for count in counts
    )


def recorded_parent(span: Any) -> Fields | None:
    """Return ``span``'s context's fields if its children may be records (see the module docstring).

    A sampled lean span from a provider whose sampler lets a sampled local
    parent decide (the SDK's default, ``parentbased_*``): its children are
    sampled without asking, as :meth:`LeanTracer.start_span` decides them.
    """
    lean = sys.modules.get(_LEAN)  # not imported: no lean span exists
    if lean is None or type(span) is not lean.LeanSpan:
        return None
    fields = _export_seam.fields(span.context)
    _, _, _, flags, _, _ = fields
    if not flags & _SAMPLED or not span.provider.children_follow:
        return None
    return fields


def end_child(
    tracer: Tracer,
    trace: TriggerTrace,
    name: str,
    attributes: Attributes,
    start: int,
    end: int,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    status: Status | None = None,
    events: Sequence[Event] = (),
    links: Sequence[Link] = (),
    shared: bool = True,
) -> None:
    """Record a child of ``trace``'s process span from ``start`` to ``end`` (Unix ns).

    The span's attributes: ``trace.shared()`` (unless ``shared`` is false), then
    ``attributes`` (the caller hands it over; it must not repeat a shared key).
    """
    common = trace.shared() if shared else None
    parent = trace.recorded_parent
    if parent is not None:  # the process span is a lean span: ``tracer`` made it
        tracer = cast("LeanTracer", tracer)
        provider = tracer.provider
        if provider.takes_records:
            trace_id, parent_id, _, flags, state, _ = parent
            record = (
                tracer.origin,
                name,
                trace_id,
                provider.id_generator.generate_span_id(),
                parent_id,
                flags,
                state,
                kind,
                start,
                end,
                attributes,
                status,
                tuple(events),
                tuple(links),
                common,
            )
            for taker in provider.record_takers:
                taker.take(record)
            return
    if common is not None:
        attributes = {**common, **attributes}
    span = tracer.start_span(
        name, context=trace.parent, kind=kind, attributes=attributes, links=links, start_time=start
    )
    for event_name, event_attributes, at in events:
        span.add_event(event_name, event_attributes, at)
    if status is not None:
        span.set_status(status)
    span.end(end)
