"""The lean tracer provider: to exporters, its spans are the SDK's spans.

Pure unit tests (no collector): the same tracer calls go through the SDK's
``TracerProvider`` and through :class:`LeanTracerProvider`, with the same
deterministic ids and explicit times, and both encoders (the SDK's protobuf
one and leaseworker's JSON one) must produce the same request for both.
Then the SDK's rules the lean span keeps: sampling, limits, attribute
cleaning, what an ended span ignores, and the status rules.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import (
    encode_spans as encode_protobuf,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
    TraceState,
    set_span_in_context,
)

from leaseworker._telemetry import _export_seam
from leaseworker._telemetry._lean import LeanTracerProvider
from leaseworker._telemetry._otlp_json import encode_spans

RESOURCE = Resource.create({"service.name": "lean-test", "service.instance.id": "pod-a"})
REMOTE = SpanContext(
    trace_id=0x0AF7651916CD43DD8448EB211C80319C,
    span_id=0xB7AD6B7169203331,
    is_remote=True,
    trace_flags=TraceFlags(TraceFlags.SAMPLED),
    trace_state=TraceState([("vendor", "v1")]),
)
T0 = 1_700_000_000_000_000_000


class _Counting(IdGenerator):
    """Ids 1, 2, 3...: the two providers hand out the same ones."""

    def __init__(self) -> None:
        self._next = itertools.count(1)

    def generate_span_id(self) -> int:
        return next(self._next)

    def generate_trace_id(self) -> int:
        return next(self._next)


Providers = Callable[..., Any]


def _sdk(exporter: InMemorySpanExporter, **options: Any) -> TracerProvider:
    provider = TracerProvider(
        resource=RESOURCE, id_generator=_Counting(), shutdown_on_exit=False, **options
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def _lean(exporter: InMemorySpanExporter, **options: Any) -> LeanTracerProvider:
    sampler = options.pop("sampler", ParentBased(ALWAYS_ON))
    provider = LeanTracerProvider(
        RESOURCE, sampler, id_generator=_Counting(), limits=options.pop("span_limits", None)
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def _trace(tracer: Tracer) -> None:
    """A trigger's trace: every call a worker makes, and a few it does not."""
    root = tracer.start_span(
        "process reports",
        context=set_span_in_context(NonRecordingSpan(REMOTE)),
        kind=SpanKind.CONSUMER,
        attributes={"messaging.system": "kafka", "messaging.kafka.offset": 2**40},
        links=[Link(REMOTE, {"link.kind": "producer"})],
        start_time=T0,
    )
    parent = set_span_in_context(root)
    acquire = tracer.start_span(
        "lease acquire", context=parent, attributes={"leaseworker.fence": 7}, start_time=T0 + 1
    )
    acquire.add_event("busy", {"leaseworker.retry_in_ms": 12.5}, T0 + 2)
    acquire.set_attributes({"tags": ["a", "b"], "deleted": True, "bad": object()})  # type: ignore[dict-item]
    acquire.set_attribute("leaseworker.outcome", "acquired")
    acquire.update_name("lease acquire")
    acquire.end(T0 + 3)
    lost = tracer.start_span("ownership lost", context=parent, start_time=T0 + 4)
    lost.set_status(Status(StatusCode.ERROR, "ownership lost: rejected"))
    lost.end(T0 + 5)
    commit = tracer.start_span(
        "commit reports", context=parent, kind=SpanKind.CLIENT, start_time=T0 + 6
    )
    commit.set_status(StatusCode.OK)
    commit.set_status(Status(StatusCode.ERROR, "too late"))  # OK is final
    commit.end(T0 + 7)
    root.set_attributes({"leaseworker.outcome": "completed"})
    root.end(T0 + 9)
    orphan = tracer.start_span(  # no traceparent: a new trace, sampled by the root rule
        "process reports", context=Context(), kind=SpanKind.CONSUMER, start_time=T0 + 10
    )
    tracer.start_span("job run", context=set_span_in_context(orphan), start_time=T0 + 11).end(
        T0 + 11
    )
    orphan.end(T0 + 12)


def _spans(make: Providers, **options: Any) -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    provider = make(exporter, **options)
    _trace(provider.get_tracer("leaseworker", "1.2.3", schema_url="https://example/1.27.0"))
    provider.shutdown()
    return list(exporter.get_finished_spans())


@pytest.mark.parametrize("read_span_contexts", ["as_tuples", "by_property"])
def test_lean_spans_encode_exactly_as_the_sdk_spans_in_protobuf_and_json(
    read_span_contexts: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same calls, same ids: the SDK encoder's request and the JSON body are identical.

    That covers what exporters read: ids, parent, kind, times, attributes
    (cleaned as the SDK cleans them), events, links, status and the
    resource and scope the spans are grouped by. Both ways of reading a span
    context's fields give it: the tuple copy (the API's layout, checked at
    import) and the properties (any other layout).
    """
    if read_span_contexts == "by_property":
        monkeypatch.setattr(_export_seam, "fields", _export_seam.by_property)
    assert _export_seam.fields(REMOTE) == _export_seam.by_property(REMOTE)
    sdk, lean = _spans(_sdk), _spans(_lean)
    assert encode_protobuf(lean) == encode_protobuf(sdk)
    assert encode_spans(lean) == encode_spans(sdk)
    for ours, theirs in zip(lean, sdk, strict=True):
        assert dict(ours.attributes or {}) == dict(theirs.attributes or {})
    [acquire] = [span for span in lean if span.name == "lease acquire"]
    kept = dict(acquire.attributes or {})
    assert kept.get("bad") is None  # not an attribute value: cleaned, as by the SDK
    assert kept["tags"] == ("a", "b")  # a list is kept as a tuple


@pytest.mark.parametrize("make", [_sdk, _lean], ids=["sdk", "lean"])
def test_a_span_without_explicit_times_takes_them_from_the_clock(make: Providers) -> None:
    """No ``start_time`` and a bare ``end()``: both times are read from the wall clock."""
    exporter = InMemorySpanExporter()
    tracer = make(exporter).get_tracer("t")
    before = time.time_ns()
    span = tracer.start_span("commit reports")
    span.add_event("committed")
    span.end()
    after = time.time_ns()
    [ended] = exporter.get_finished_spans()
    [event] = ended.events
    start, end = ended.start_time or 0, ended.end_time or 0
    assert before <= start <= event.timestamp <= end <= after


@pytest.mark.parametrize("make", [_sdk, _lean], ids=["sdk", "lean"])
def test_the_sampler_decides_and_sampled_out_spans_record_nothing(make: Providers) -> None:
    """ALWAYS_OFF: spans are non-recording and nothing is exported, in both providers."""
    exporter = InMemorySpanExporter()
    provider = make(exporter, sampler=ParentBased(ALWAYS_OFF))
    span = provider.get_tracer("t").start_span("process reports")
    assert not span.is_recording()
    assert span.get_span_context().is_valid
    child = provider.get_tracer("t").start_span("job run", context=set_span_in_context(span))
    assert not child.is_recording()  # parent-based: the trace stays unsampled
    child.end()
    span.end()
    assert exporter.get_finished_spans() == ()


@pytest.mark.parametrize("make", [_sdk, _lean], ids=["sdk", "lean"])
def test_a_sampler_that_drops_children_of_sampled_spans_is_still_asked(make: Providers) -> None:
    """Only the default rule for children (sampled parent: sample) is taken without asking."""
    exporter = InMemorySpanExporter()
    provider = make(exporter, sampler=ParentBased(ALWAYS_ON, local_parent_sampled=ALWAYS_OFF))
    tracer = provider.get_tracer("t")
    root = tracer.start_span("process reports")
    child = tracer.start_span("job run", context=set_span_in_context(root))
    assert root.is_recording()
    assert not child.is_recording()
    child.end()
    root.end()
    assert [span.name for span in exporter.get_finished_spans()] == ["process reports"]


@pytest.mark.parametrize("make", [_sdk, _lean], ids=["sdk", "lean"])
def test_span_limits_drop_and_count_as_the_sdk_does(make: Providers) -> None:
    """Limits count what they drop: the oldest attributes, the newest events and links."""
    exporter = InMemorySpanExporter()
    limits = SpanLimits(max_span_attributes=2, max_events=1, max_links=1)
    provider = make(exporter, span_limits=limits)
    span = provider.get_tracer("t").start_span(
        "s", attributes={"a": 1, "b": 2, "c": 3}, links=[Link(REMOTE), Link(REMOTE)]
    )
    span.add_event("first")
    span.add_event("second")
    span.end()
    [done] = exporter.get_finished_spans()
    assert dict(done.attributes or {}) == {"b": 2, "c": 3}
    assert (done.dropped_attributes, done.dropped_events, done.dropped_links) == (1, 1, 1)
    assert [event.name for event in done.events] == ["second"]


def test_an_ended_lean_span_ignores_changes_and_is_exported_once() -> None:
    """After ``end``: attributes, events, status and a second ``end`` change nothing."""
    exporter = InMemorySpanExporter()
    provider = _lean(exporter)
    span = provider.get_tracer("t").start_span("s", attributes={"a": 1})
    span.end(T0)
    span.set_attribute("a", 2)
    span.add_event("late")
    span.set_status(Status(StatusCode.ERROR, "late"))
    span.update_name("renamed")
    span.end(T0 + 1)
    [done] = exporter.get_finished_spans()
    assert (done.name, dict(done.attributes or {}), done.end_time) == ("s", {"a": 1}, T0)
    assert (done.events, done.status.status_code) == ((), StatusCode.UNSET)


def test_record_exception_keeps_type_and_frames_but_not_the_message() -> None:
    """Exception messages may quote payload data, which never goes into leaseworker's spans."""
    exporter = InMemorySpanExporter()
    provider = _lean(exporter)
    tracer = provider.get_tracer("t")
    text = "customer secret@example.com"
    with pytest.raises(ValueError, match="secret"), tracer.start_as_current_span("job run"):
        raise ValueError(text)
    [done] = exporter.get_finished_spans()
    [event] = done.events
    assert event.name == "exception"
    assert event.attributes is not None
    assert event.attributes["exception.type"] == "ValueError"
    assert "test_record_exception" in str(event.attributes["exception.stacktrace"])
    assert "secret" not in str(dict(event.attributes)) + str(done.status.description)
    assert done.status.status_code is StatusCode.ERROR
