"""OTLP/JSON span encoding: the same request as the SDK's protobuf encoder, in OTLP's JSON.

Pure unit tests on real SDK spans (no collector): the JSON body, read back
with protobuf's JSON parser after turning OTLP's hex ids into protobuf JSON's
base64, must equal the SDK encoder's ``ExportTraceServiceRequest``.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import pytest
from google.protobuf import json_format  # type: ignore[import-untyped]
from opentelemetry.exporter.otlp.proto.common.trace_encoder import (
    encode_spans as encode_protobuf,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from leaseworker._telemetry._otlp_json import JsonSpanEncoder, encode_spans

REMOTE = SpanContext(
    trace_id=0x0AF7651916CD43DD8448EB211C80319C,
    span_id=0xB7AD6B7169203331,
    is_remote=True,
    trace_flags=TraceFlags(TraceFlags.SAMPLED),
    trace_state=TraceState([("vendor", "v1")]),
)


def _spans() -> list[ReadableSpan]:
    """A small trace like a trigger's: a CONSUMER root under a remote parent, and children."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "json-test", "service.instance.id": "pod-a"})
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("leaseworker", "1.2.3", schema_url="https://example/1.27.0")
    common: dict[str, Any] = {
        "messaging.system": "kafka",
        "messaging.destination.partition.id": "0",
        "messaging.kafka.offset": 2**40,
        "leaseworker.job.key": 'report:"ünïcode"\n',
    }
    root = tracer.start_span(
        "process reports",
        context=set_span_in_context(NonRecordingSpan(REMOTE)),
        kind=SpanKind.CONSUMER,
        attributes={**common, "messaging.message.body.size": 0},
        links=[Link(REMOTE, {"link.kind": "producer"})],
        start_time=1_700_000_000_123_456_789,
    )
    parent = set_span_in_context(root)
    child = tracer.start_span(
        "lease acquire", context=parent, attributes={**common, "leaseworker.fence": 7}
    )
    child.add_event("busy", {"leaseworker.outcome": "busy", "leaseworker.retry_in_ms": 12.5})
    child.set_attributes(
        {
            "leaseworker.lease.wait_ms": 0.25,
            "leaseworker.release.deleted": True,
            "tags": ("a", "b"),
            "sizes": (1, 2),
        }
    )
    child.end()
    failed = tracer.start_span("ownership lost", context=parent, attributes=common)
    failed.set_status(Status(StatusCode.ERROR, "ownership lost: rejected"))
    failed.end()
    commit = tracer.start_span(
        "commit reports", context=parent, kind=SpanKind.CLIENT, attributes=common
    )
    commit.set_status(Status(StatusCode.OK))
    commit.end()
    root.end(1_700_000_000_223_456_789)
    provider.shutdown()
    return list(exporter.get_finished_spans())


def _hex_ids_to_base64(node: Any) -> Any:
    """Turn OTLP/JSON's hex ids into protobuf JSON's base64 bytes, recursively."""
    if isinstance(node, list):
        return [_hex_ids_to_base64(item) for item in node]
    if isinstance(node, dict):
        return {
            key: base64.b64encode(bytes.fromhex(value)).decode()
            if key in ("traceId", "spanId", "parentSpanId")
            else _hex_ids_to_base64(value)
            for key, value in node.items()
        }
    return node


def _normalized(request: ExportTraceServiceRequest) -> ExportTraceServiceRequest:
    """Drop what only says the same differently: the trace-flag bits, an empty UNSET status.

    The SDK encoder leaves the trace flags out of ``flags`` (OTLP puts them in
    bits 0-7), sends an empty status message for UNSET (JSON leaves it out) and
    leaves out a link's trace state (JSON keeps it).
    """
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                span.flags &= 0x300
                if span.status.code == 0 and not span.status.message:
                    span.ClearField("status")
                for link in span.links:
                    link.flags &= 0x300
                    link.ClearField("trace_state")
    return request


def test_json_body_is_the_sdk_protobuf_request_in_otlp_json() -> None:
    """Field for field the SDK encoder's request: ids, times, kinds, status, events, links."""
    spans = _spans()
    body = json.loads(encode_spans(spans))
    parsed = json_format.ParseDict(_hex_ids_to_base64(body), ExportTraceServiceRequest())
    expected = encode_protobuf(spans)
    assert _normalized(parsed) == _normalized(expected)
    [root] = [s for s in parsed.resource_spans[0].scope_spans[0].spans if s.name.startswith("pro")]
    assert root.flags & 0x300 == 0x300  # the parent is remote


def test_json_follows_otlp_rules_hex_ids_string_int64_integer_enums() -> None:
    """OTLP/JSON, not plain protobuf JSON: hex ids, decimal-string int64s, enums as integers."""
    body = json.loads(encode_spans(_spans()))
    [resource_spans] = body["resourceSpans"]
    [scope_spans] = resource_spans["scopeSpans"]
    assert scope_spans["scope"] == {"name": "leaseworker", "version": "1.2.3"}
    assert scope_spans["schemaUrl"] == "https://example/1.27.0"
    by_name = {span["name"]: span for span in scope_spans["spans"]}
    root = by_name["process reports"]
    assert root["traceId"] == "0af7651916cd43dd8448eb211c80319c"
    assert root["parentSpanId"] == "b7ad6b7169203331"
    assert len(root["spanId"]) == 16
    assert root["kind"] == 5  # SPAN_KIND_CONSUMER
    assert root["startTimeUnixNano"] == "1700000000123456789"
    assert root["flags"] == 0x301  # sampled, parent is remote
    assert root["links"][0]["traceState"] == "vendor=v1"
    offset = {a["key"]: a["value"] for a in root["attributes"]}["messaging.kafka.offset"]
    assert offset == {"intValue": str(2**40)}
    assert by_name["commit reports"]["kind"] == 3  # SPAN_KIND_CLIENT
    assert by_name["ownership lost"]["status"] == {
        "code": 2,
        "message": "ownership lost: rejected",
    }
    assert "status" not in by_name["lease acquire"]  # UNSET is left out


def test_cached_pieces_keep_bool_and_int_apart_and_non_finite_doubles_valid() -> None:
    """``True`` and ``1`` hash alike: the remembered KeyValues must still differ by type."""
    encoder = JsonSpanEncoder()
    first = encoder.attributes({"x": 1, "y": True})
    second = encoder.attributes({"x": True, "y": 1})
    assert json.loads(f"[{first}]") == [
        {"key": "x", "value": {"intValue": "1"}},
        {"key": "y", "value": {"boolValue": True}},
    ]
    assert json.loads(f"[{second}]") == [
        {"key": "x", "value": {"boolValue": True}},
        {"key": "y", "value": {"intValue": "1"}},
    ]
    odd = json.loads(f"[{encoder.attributes({'n': math.nan, 'i': -math.inf})}]")
    assert [a["value"]["doubleValue"] for a in odd] == ["NaN", "-Infinity"]


@pytest.mark.parametrize("batches", [1, 3])
def test_one_encoder_gives_the_same_body_across_batches(batches: int) -> None:
    """What an encoder remembers from earlier batches never changes a later body."""
    spans = _spans()
    encoder = JsonSpanEncoder()
    for _ in range(batches):
        body = encoder.encode(spans)
    assert body == encode_spans(spans)
