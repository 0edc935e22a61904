"""A ``SpanContext``'s fields, read without a property call per field.

The lean tracer and the JSON encoder read several fields of every span's
context; the API's ``SpanContext`` is a tuple, copied in C when its layout is
the one checked at import, else read field by field. Callers look ``fields`` up
on this module at each call, so a test can swap in :func:`by_property`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from opentelemetry.trace import SpanContext, TraceFlags, TraceState

Fields = tuple[int, int, bool, TraceFlags, TraceState, bool]
"""trace id, span id, is remote, trace flags, trace state, is valid."""


def by_property(context: SpanContext) -> Fields:
    """Return the fields through the API's properties (the reference)."""
    return (
        context.trace_id,
        context.span_id,
        context.is_remote,
        context.trace_flags,
        context.trace_state,
        context.is_valid,
    )


def _layout_is_the_tuple() -> bool:
    probe = SpanContext(1, 2, True, TraceFlags(1), TraceState([("k", "v")]))
    return tuple(probe) == by_property(probe)


TUPLE_LAYOUT = _layout_is_the_tuple()

fields = cast(Callable[[SpanContext], Fields], tuple) if TUPLE_LAYOUT else by_property
"""Return a span context's fields: with the known layout, ``tuple`` copies them in C."""
