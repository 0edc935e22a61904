"""Read Jaeger's JSON answers, either query API's, into one plain span form.

The classic ``/api/traces`` answers in Jaeger's own model (``data``: traces of
spans with typed tags, microsecond times, processes); the OTLP-shaped
``/api/v3/traces`` answers an OTLP/JSON ``TracesData`` (``resourceSpans``).
Both become :class:`JaegerSpan` s here, once, for the one reader
(:mod:`._jaeger`). Times stay integer Unix nanoseconds, so nothing is lost to floats.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal

SpanStatus = Literal["unset", "ok", "error"]


@dataclass(frozen=True, slots=True, kw_only=True)
class JaegerSpan:
    """One span as Jaeger answered it, in a form both APIs share.

    Ids are lowercase hex (32 digits for traces, 16 for spans),
    ``parent_span_id`` is ``None`` for a root span, times are Unix nanoseconds,
    ``links`` are (trace id, span id) pairs. ``attributes`` are flat: OTLP
    integers as ``int``, doubles as ``float``, booleans as ``bool``, arrays as
    ``list``, key-value lists as ``dict``, bytes as their base64 text; a classic
    answer's tags are all there, including those its OTLP translation adds
    (``span.kind``, ``otel.status_code``...; see :data:`V1_SYNTHETIC_TAGS`).
    """

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str | None
    start_time_unix_nano: int
    end_time_unix_nano: int
    status: SpanStatus
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...] = ()


V1_SYNTHETIC_TAGS = frozenset(
    {
        "span.kind",
        "otel.status_code",
        "otel.status_description",
        "otel.scope.name",
        "otel.scope.version",
        "internal.span.format",
    }
)
"""Tags that Jaeger's OTLP -> v1 model translation adds; they are not span attributes."""


def spans_from_v1(traces: Iterable[dict[str, Any]]) -> list[JaegerSpan]:
    """Read the traces of a classic ``/api/traces`` answer (its ``data`` list)."""
    spans: list[JaegerSpan] = []
    for trace in traces:
        processes: dict[str, Any] = trace.get("processes") or {}
        for raw in trace.get("spans") or []:
            tags = {tag["key"]: _v1_value(tag) for tag in raw.get("tags") or []}
            parent, links = None, []
            for ref in raw.get("references") or []:
                pair = (_hex(ref["traceID"], 32), _hex(ref["spanID"], 16))
                if ref.get("refType") == "CHILD_OF" and parent is None:
                    parent = pair[1]
                else:
                    links.append(pair)
            start_us, duration_us = int(raw.get("startTime", 0)), int(raw.get("duration", 0))
            process = processes.get(raw.get("processID", ""), {})
            spans.append(
                JaegerSpan(
                    service=str(process.get("serviceName", "")),
                    name=str(raw.get("operationName", "")),
                    trace_id=_hex(raw["traceID"], 32),
                    span_id=_hex(raw["spanID"], 16),
                    parent_span_id=parent,
                    start_time_unix_nano=start_us * 1000,
                    end_time_unix_nano=(start_us + duration_us) * 1000,
                    status=_V1_STATUS.get(str(tags.get("otel.status_code", "")).upper(), "unset"),
                    attributes=tags,
                    links=tuple(links),
                )
            )
    return spans


def without_v1_tags(span: JaegerSpan) -> JaegerSpan:
    """Return a classic answer's ``span`` without the tags its OTLP translation added.

    The translation also marks error spans with ``error=true``; a real attribute
    of that name and value is indistinguishable from it and dropped too.
    """
    tags = {k: v for k, v in span.attributes.items() if k not in V1_SYNTHETIC_TAGS}
    if span.status == "error" and tags.get("error") is True:
        del tags["error"]
    return replace(span, attributes=tags)


def spans_from_otlp(traces_data: dict[str, Any]) -> list[JaegerSpan]:
    """Read an OTLP/JSON ``TracesData`` object (the v3 API's ``result``)."""
    spans: list[JaegerSpan] = []
    for resource_spans in traces_data.get("resourceSpans") or []:
        resource = _otlp_attributes(resource_spans.get("resource", {}).get("attributes") or [])
        service = str(resource.get("service.name", ""))
        for scope_spans in resource_spans.get("scopeSpans") or []:
            for raw in scope_spans.get("spans") or []:
                parent = raw.get("parentSpanId")
                spans.append(
                    JaegerSpan(
                        service=service,
                        name=str(raw.get("name", "")),
                        trace_id=_hex(raw["traceId"], 32),
                        span_id=_hex(raw["spanId"], 16),
                        parent_span_id=_hex(parent, 16) if parent else None,
                        start_time_unix_nano=int(raw.get("startTimeUnixNano", 0)),
                        end_time_unix_nano=int(raw.get("endTimeUnixNano", 0)),
                        status=_OTLP_STATUS.get(raw.get("status", {}).get("code", 0), "unset"),
                        attributes=_otlp_attributes(raw.get("attributes") or []),
                        links=tuple(
                            (_hex(link["traceId"], 32), _hex(link["spanId"], 16))
                            for link in raw.get("links") or []
                        ),
                    )
                )
    return spans


def v3_found_nothing(body: bytes) -> bool:
    """Tell whether a 404 from ``/api/v3/traces`` means "no traces found".

    The v3 API answers an empty search with 404 and a JSON error object; a 404
    without that body means the route is missing (a Jaeger without the v3 API).
    """
    try:
        parsed = json.loads(body)
    except ValueError:
        return False
    return isinstance(parsed, dict) and isinstance(parsed.get("error"), dict)


_V1_STATUS: dict[str, SpanStatus] = {"OK": "ok", "ERROR": "error"}

_OTLP_STATUS: dict[int | str, SpanStatus] = {
    0: "unset",
    1: "ok",
    2: "error",
    "STATUS_CODE_UNSET": "unset",
    "STATUS_CODE_OK": "ok",
    "STATUS_CODE_ERROR": "error",
}


def _v1_value(tag: dict[str, Any]) -> Any:
    """Convert a classic-API tag value (typed by ``tag["type"]``) to Python."""
    kind, value = tag.get("type"), tag.get("value")
    if kind == "int64":
        return int(value)  # type: ignore[arg-type]
    if kind == "float64":
        return float(value)  # type: ignore[arg-type]
    if kind == "bool":
        return bool(value)
    return value


def _otlp_attributes(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """Flatten an OTLP/JSON ``KeyValue`` list into a dict."""
    return {pair["key"]: _otlp_value(pair.get("value") or {}) for pair in pairs}


def _otlp_value(value: dict[str, Any]) -> Any:
    """Convert an OTLP/JSON ``AnyValue`` to a plain Python value (``None`` if empty)."""
    if "stringValue" in value:
        return str(value["stringValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "intValue" in value:
        return int(value["intValue"])  # int64 travels as a JSON string
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "bytesValue" in value:
        return str(value["bytesValue"])
    if "arrayValue" in value:
        return [_otlp_value(v) for v in value["arrayValue"].get("values") or []]
    if "kvlistValue" in value:
        return _otlp_attributes(value["kvlistValue"].get("values") or [])
    return None


def _hex(value: str, digits: int) -> str:
    return str(value).lower().rjust(digits, "0")
