"""OTLP/HTTP JSON encoding of finished spans, and the span exporter that sends it.

The JSON text is written directly instead of building protobuf objects in
Python in the export thread, which competes with the event loop for the GIL;
it goes through the SDK exporter's own client and settings. The encoding rules
and the exporter: see docs/design.md#otlpjson-export.
"""

from __future__ import annotations

import base64
import json
import logging
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, final

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace.span import DEFAULT_TRACE_STATE

from . import _export_seam

logger = logging.getLogger("leaseworker.telemetry")

CONTENT_TYPE = "application/json"

_HAS_IS_REMOTE = 0x100  # SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE = 0x200  # SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK

_JSON = json.JSONEncoder(ensure_ascii=False, check_circular=False, separators=(",", ":"))
"""One reusable C encoder; non-ASCII text stays UTF-8 (smaller than ``\\u`` escapes)."""

_string = json.encoder.encode_basestring
"""A str as a JSON string literal, UTF-8 kept: what ``_JSON`` does for one, in C."""

_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
"""Protobuf JSON spells non-finite doubles as strings (``json`` would write bare NaN)."""

JsonObject = dict[str, Any]


def encode_spans(spans: Iterable[ReadableSpan]) -> bytes:
    """Return the OTLP/JSON ``ExportTraceServiceRequest`` body for ``spans`` (UTF-8)."""
    return JsonSpanEncoder().encode(spans)


@final
class JsonSpanEncoder:
    """Encodes batches of spans as OTLP/JSON text, reusing what repeats between spans.

    A trigger's spans share most attributes (topic, partition, offset, pod,
    group, job key, execution id, fence), and span names repeat, so the JSON of
    each ``KeyValue`` and name is kept, up to :attr:`MAX_CACHED` of each
    (then forgotten). The body is joined from those pieces; only values never
    seen before go through ``json``. One encoder serves one exporter thread.
    """

    MAX_CACHED = 8192

    def __init__(self) -> None:
        self._pairs: dict[tuple[str, type, object], str] = {}
        self._names: dict[str, str] = {}
        self._shared: dict[int, tuple[object, str]] = {}  # for one batch, by the dict's id

    def encode(self, spans: Iterable[ReadableSpan | tuple[Any, ...]]) -> bytes:
        """Return the request body: spans grouped by resource, then by scope."""
        by_resource: dict[int, tuple[Any, dict[int, tuple[Any, list[str]]]]] = {}
        last: tuple[Any, Any] = (None, None)
        group: list[str] = []
        for span in spans:
            if isinstance(span, tuple):  # a span record (``_span_records``)
                resource, scope = span[0]
                encoded = self.record(span)
            else:
                resource, scope = span.resource, span.instrumentation_scope
                encoded = self.span(span)
            if resource is not last[0] or scope is not last[1]:  # mostly one tracer's spans
                last = (resource, scope)
                scopes = by_resource.setdefault(id(resource), (resource, {}))[1]
                group = scopes.setdefault(id(scope), (scope, []))[1]
            group.append(encoded)
        self._shared.clear()  # the batch's records held the dicts: their ids may be reused now
        resource_spans = ",".join(
            f'{{"resource":{{"attributes":[{self.attributes(resource.attributes)}]}},'
            f'"scopeSpans":[{",".join(self._scope_spans(s, e) for s, e in scopes.values())}],'
            f'"schemaUrl":{_JSON.encode(resource.schema_url or "")}}}'
            for resource, scopes in by_resource.values()
        )
        return f'{{"resourceSpans":[{resource_spans}]}}'.encode()

    def _scope_spans(self, scope: Any, spans: list[str]) -> str:
        if scope is None:
            return f'{{"scope":{{}},"spans":[{",".join(spans)}]}}'
        encoded: JsonObject = {"name": scope.name}
        if scope.version:
            encoded["version"] = scope.version
        head = _JSON.encode(encoded)
        if scope.attributes:
            head = f'{head[:-1]},"attributes":[{self.attributes(scope.attributes)}]}}'
        schema_url = _JSON.encode(scope.schema_url or "")
        return f'{{"scope":{head},"spans":[{",".join(spans)}],"schemaUrl":{schema_url}}}'

    def span(self, span: ReadableSpan) -> str:
        """Return a span's JSON: ids in hex, times as decimal strings, kind and status as ints."""
        context = span.context
        assert context is not None  # the SDK's spans always have one
        trace_id, span_id, _, trace_flags, trace_state, _ = _export_seam.fields(context)
        parent = span.parent
        flags = int(trace_flags) | _HAS_IS_REMOTE
        extra = ""
        if parent is not None:
            _, parent_id, parent_remote, _, _, _ = _export_seam.fields(parent)
            extra = f',"parentSpanId":"{parent_id:016x}"'
            if parent_remote:
                flags |= _IS_REMOTE
        if trace_state is not DEFAULT_TRACE_STATE and trace_state:  # the shared empty one
            extra += ',"traceState":' + _JSON.encode(trace_state.to_header())
        if span.dropped_attributes:
            extra += f',"droppedAttributesCount":{span.dropped_attributes}'
        events, links = span.events, span.links  # each a copy: read once
        if events:
            encoded = ",".join(
                f'{{"timeUnixNano":"{event.timestamp}","name":{self.name(event.name)},'
                f'"attributes":[{self.attributes(event.attributes)}]}}'
                for event in events
            )
            extra += f',"events":[{encoded}]'
        if span.dropped_events:
            extra += f',"droppedEventsCount":{span.dropped_events}'
        if links:
            extra += f',"links":[{",".join(self._link(link) for link in links)}]'
        if span.dropped_links:
            extra += f',"droppedLinksCount":{span.dropped_links}'
        status = span.status
        code = status.status_code._value_  # ``_value_``: the member's value, no property call
        if code:  # UNSET is the default: left out
            message = status.description
            message = f',"message":{_JSON.encode(message)}' if message else ""
            extra += f',"status":{{"code":{code}{message}}}'
        name = self._names.get(span.name) or self.name(span.name)
        # OTLP numbers span kinds from 1 (INTERNAL), the API from 0.
        return (
            f'{{"traceId":"{trace_id:032x}","spanId":"{span_id:016x}",'
            f'"name":{name},"kind":{span.kind._value_ + 1},'
            f'"startTimeUnixNano":"{span.start_time or 0}",'
            f'"endTimeUnixNano":"{span.end_time or 0}",'
            f'"attributes":[{self.attributes(span.attributes)}],"flags":{flags}{extra}}}'
        )

    def record(self, record: tuple[Any, ...]) -> str:
        """Return a span record's JSON (``_records.Record``): what :meth:`span` gives its span."""
        _, name, trace_id, span_id, parent_id, flags, state, kind, start, end = record[:10]
        attributes, status, events, links, shared = record[10:]
        encoded_attributes = self.attributes(attributes)
        if shared:
            known = self._shared.get(id(shared))
            if known is None or known[0] is not shared:
                known = self._shared[id(shared)] = (shared, self.attributes(shared))
            if not encoded_attributes:
                encoded_attributes = known[1]
            elif known[1]:
                encoded_attributes = f"{known[1]},{encoded_attributes}"
        extra = f',"parentSpanId":"{parent_id:016x}"'  # a local parent: never remote
        if state is not DEFAULT_TRACE_STATE and state:
            extra += ',"traceState":' + _JSON.encode(state.to_header())
        if events:
            encoded = ",".join(
                f'{{"timeUnixNano":"{at}","name":{self.name(event_name)},'
                f'"attributes":[{self.attributes(event_attributes)}]}}'
                for event_name, event_attributes, at in events
            )
            extra += f',"events":[{encoded}]'
        if links:
            extra += f',"links":[{",".join(self._link(link) for link in links)}]'
        if status is not None and status.status_code._value_:
            message = status.description
            message = f',"message":{_JSON.encode(message)}' if message else ""
            extra += f',"status":{{"code":{status.status_code._value_}{message}}}'
        return (
            f'{{"traceId":"{trace_id:032x}","spanId":"{span_id:016x}",'
            f'"name":{self._names.get(name) or self.name(name)},"kind":{kind._value_ + 1},'
            f'"startTimeUnixNano":"{start}","endTimeUnixNano":"{end}",'
            f'"attributes":[{encoded_attributes}],'
            f'"flags":{int(flags) | _HAS_IS_REMOTE}{extra}}}'
        )

    def _link(self, link: Any) -> str:
        context = link.context
        flags = int(context.trace_flags) | _HAS_IS_REMOTE | (_IS_REMOTE if context.is_remote else 0)
        state = context.trace_state
        state = f',"traceState":{_JSON.encode(state.to_header())}' if state else ""
        return (
            f'{{"traceId":"{context.trace_id:032x}","spanId":"{context.span_id:016x}",'
            f'"attributes":[{self.attributes(link.attributes)}],"flags":{flags}{state}}}'
        )

    def name(self, name: str) -> str:
        """Return a span or event name as a JSON string (remembered)."""
        encoded = self._names.get(name)
        if encoded is None:
            if len(self._names) >= self.MAX_CACHED:
                self._names.clear()
            encoded = self._names[name] = _JSON.encode(name)
        return encoded

    def attributes(self, attributes: Mapping[str, Any] | None) -> str:
        """Return attributes as comma-separated ``KeyValue`` objects (unencodable: dropped)."""
        if not attributes:
            return ""
        known = self._pairs.get
        try:
            parts = [
                known((key, type(value), value)) or self._remember(key, value)
                for key in attributes  # iterating and indexing beats the SDK mapping's .items()
                for value in (attributes[key],)
            ]
        except TypeError:  # an unhashable value (a list given to a non-SDK span)
            parts = [_key_value(key, value) for key, value in attributes.items()]
        if "" in parts:
            parts = [part for part in parts if part]
        return ",".join(parts)

    def _remember(self, key: str, value: Any) -> str:
        part = _key_value(key, value)
        if len(self._pairs) >= self.MAX_CACHED:
            self._pairs.clear()
        self._pairs[(key, type(value), value)] = part
        return part


def _key_value(key: str, value: Any) -> str:
    """One ``KeyValue`` object's JSON, or ``""`` when the value cannot be encoded.

    The four scalar types are written directly (strings through the C string
    encoder ``json`` itself uses): values never seen before are common (ids,
    round trips), and building a dict for ``json`` cost three Python calls more.
    """
    kind = type(value)
    if kind is str:
        return f'{{"key":{_string(key)},"value":{{"stringValue":{_string(value)}}}}}'
    if kind is int:
        return f'{{"key":{_string(key)},"value":{{"intValue":"{value}"}}}}'
    if kind is float and math.isfinite(value):
        return f'{{"key":{_string(key)},"value":{{"doubleValue":{value!r}}}}}'
    if kind is bool:
        return f'{{"key":{_string(key)},"value":{{"boolValue":{"true" if value else "false"}}}}}'
    any_value = _any_value(value)
    return "" if any_value is None else _JSON.encode({"key": key, "value": any_value})


def _any_value(value: Any) -> JsonObject | None:  # noqa: C901  # one flat type dispatch, fast path first
    """One ``AnyValue``; the common types first, checked by exact type (the fast path)."""
    kind = type(value)
    if kind is str:
        return {"stringValue": value}
    if kind is int:
        return {"intValue": str(value)}
    if kind is bool:
        return {"boolValue": value}
    if kind is float:
        return {"doubleValue": value if math.isfinite(value) else _NON_FINITE[str(value)]}
    if isinstance(value, bool):
        return {"boolValue": bool(value)}
    if isinstance(value, int):
        return {"intValue": str(int(value))}
    if isinstance(value, str):
        return {"stringValue": str(value)}
    if isinstance(value, float):
        return _any_value(float(value))
    if isinstance(value, bytes):
        return {"bytesValue": base64.b64encode(value).decode()}
    if isinstance(value, Mapping):
        values = [{"key": k, "value": v} for k, v in _items(value) if v is not None]
        return {"kvlistValue": {"values": values}}
    if isinstance(value, Sequence):
        values = [v for v in map(_any_value, value) if v is not None]
        return {"arrayValue": {"values": values}}
    return None


@final
class OtlpJsonSpanExporter(SpanExporter):
    """A span exporter posting OTLP/JSON through the SDK's OTLP/HTTP client.

    ``endpoint`` as in the SDK's ``OTLPSpanExporter`` (the full ``/v1/traces``
    URL; ``None``: from the ``OTEL_EXPORTER_OTLP_*`` variables). Raises
    ``TypeError`` when the installed SDK exporter has no client to send through
    (another version; see ``_export_seam``): the caller then falls back to the
    standard exporter.
    """

    def __init__(self, endpoint: str | None = None) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        # Explicit headers win over the environment's, so only the body's type changes.
        self._transport = OTLPSpanExporter(
            endpoint=endpoint, headers={"content-type": CONTENT_TYPE}
        )
        self._client: Any = _export_seam.otlp_http_client(self._transport)
        if self._client is None:
            self._transport.shutdown()  # type: ignore[no-untyped-call]
            raise TypeError("this opentelemetry-exporter-otlp-proto-http has no OTLP HTTP client")
        self._encoder = JsonSpanEncoder()  # the batch processor calls export from one thread
        self.takes_records = True  # span records too (``_span_records``)
        self._shutdown = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Encode ``spans`` as OTLP/JSON and post them (with the SDK client's retries)."""
        if self._shutdown:
            return SpanExportResult.FAILURE
        try:
            body = self._encoder.encode(spans)
        except Exception:
            logger.exception("could not encode %d spans as OTLP/JSON", len(spans))
            return SpanExportResult.FAILURE
        result = self._client.export(body)
        if not result.success:
            # The client logged why (status code or error); say how much was lost.
            logger.warning("OTLP/JSON export of %d spans failed", len(spans))
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Stop exporting and close the HTTP client."""
        if not self._shutdown:
            self._shutdown = True
            self._transport.shutdown()  # type: ignore[no-untyped-call]

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing is buffered here (the batch processor holds the spans)."""
        return True


def _items(mapping: Mapping[Any, Any]) -> Iterator[tuple[str, JsonObject | None]]:
    for key, value in mapping.items():
        yield str(key), _any_value(value)
