"""The producer side: a ``send {topic}`` span whose context travels in the record's headers.

``leaseworker trigger`` sends through :func:`traced_send`; the worker's
``process {topic}`` span then continues that trace (W3C ``traceparent`` in the
record headers).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from opentelemetry.trace import (
    Span,
    SpanKind,
    TracerProvider,
    format_trace_id,
    set_span_in_context,
)

from .._version import __version__
from . import _names as n
from ._propagation import inject
from ._telemetry import SCHEMA_URL


@dataclass
class OutgoingTrigger:
    """Headers to send with the record, and the trace they start."""

    headers: list[tuple[str, bytes]] = field(default_factory=list)
    trace_id: str = ""
    span: Span | None = None

    def sent(self, partition: int, offset: int) -> None:
        """Record where the record landed on the send span."""
        if self.span is not None:
            self.span.set_attributes(
                {n.MESSAGING_PARTITION: str(partition), n.MESSAGING_OFFSET: offset}
            )


@contextlib.contextmanager
def traced_send(
    topic: str, key: str | None, tracer_provider: TracerProvider | None = None
) -> Iterator[OutgoingTrigger]:
    """Yield the headers for one trigger; a PRODUCER span covers the block when tracing.

    Without a tracer provider nothing is injected: the consumer starts its own
    trace rather than pointing at a parent span nobody exported.
    """
    if tracer_provider is None:
        yield OutgoingTrigger()
        return
    tracer = tracer_provider.get_tracer("leaseworker", __version__, schema_url=SCHEMA_URL)
    attributes: dict[str, str] = {
        n.MESSAGING_SYSTEM: "kafka",
        n.MESSAGING_OPERATION_NAME: "send",
        n.MESSAGING_OPERATION_TYPE: "send",
        n.MESSAGING_DESTINATION: topic,
    }
    if key is not None:
        attributes[n.MESSAGING_KEY] = key
    with tracer.start_as_current_span(
        n.send_span_name(topic), kind=SpanKind.PRODUCER, attributes=attributes
    ) as span:
        outgoing = OutgoingTrigger(
            trace_id=format_trace_id(span.get_span_context().trace_id), span=span
        )
        inject(outgoing.headers, set_span_in_context(span))
        yield outgoing
