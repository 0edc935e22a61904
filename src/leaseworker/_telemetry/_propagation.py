"""W3C trace context in Kafka record headers: inject on send, extract on receive.

Kafka headers are ``(name, bytes)`` pairs; these adapters let the W3C
``traceparent``/``tracestate`` propagator read and write them. The propagator is
used directly, not the global one, so an application's global propagator
settings never change what leaseworker puts on the wire.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableSequence, Sequence

from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.trace import Link, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

Headers = Sequence[tuple[str, bytes]]

_PROPAGATOR = TraceContextTextMapPropagator()


class _HeaderGetter(Getter[Headers]):
    """Read header values (decoded as UTF-8) by case-insensitive name."""

    def get(self, carrier: Headers, key: str) -> list[str] | None:
        values = [
            value.decode("utf-8", "replace")
            for name, value in carrier
            if name.lower() == key and isinstance(value, bytes | bytearray)
        ]
        return values or None

    def keys(self, carrier: Headers) -> list[str]:
        return [name for name, _ in carrier]


_GETTER = _HeaderGetter()


class _HeaderSetter(Setter[MutableSequence[tuple[str, bytes]]]):
    """Append a header, replacing any earlier one of the same name."""

    def set(self, carrier: MutableSequence[tuple[str, bytes]], key: str, value: str) -> None:
        carrier[:] = [(name, v) for name, v in carrier if name.lower() != key]
        carrier.append((key, value.encode()))


def inject(headers: MutableSequence[tuple[str, bytes]], context: Context | None = None) -> None:
    """Write ``context``'s span (default: the current one) as ``traceparent`` into ``headers``."""
    _PROPAGATOR.inject(headers, context=context, setter=_HeaderSetter())


def extract(headers: Iterable[tuple[str, bytes]]) -> Context:
    """Return the producer's context from ``headers`` (empty when there is none or it is bad)."""
    return _PROPAGATOR.extract(tuple(headers), getter=_GETTER)


def consumer_parent(
    headers: Sequence[tuple[str, bytes]] | None, *, parent_on_producer: bool = True
) -> tuple[Context, list[Link]]:
    """Return the parent context and the links of the span that processes a record.

    With a valid ``traceparent`` in ``headers`` the span links to the
    producer's span and, with ``parent_on_producer``, is its child; otherwise
    it starts a new trace. A record without headers (a producer without
    tracing) is answered without asking the propagator.
    """
    if not headers:
        return Context(), []
    producer = extract(headers)
    span_context = get_current_span(producer).get_span_context()
    if not span_context.is_valid:
        return Context(), []
    return (producer if parent_on_producer else Context()), [Link(span_context)]
