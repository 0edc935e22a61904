"""PodTelemetry's hooks driven directly with fake Kafka records: what each span starts with.

Pure unit tests (fake records and topic-partitions, no broker or Redis): the
hooks are called in the order the worker calls them, spans go to the SDK's
in-memory exporter, and a span processor notes each span's attributes at the
moment it starts. The span contract says the identity and messaging
attributes are there from the start, not added later.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import anyio
import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased
from opentelemetry.trace import StatusCode

from leaseworker import Attempt, ExecutionEvent, LeaseEvent, SourceEvent, Trigger
from leaseworker._telemetry import PodTelemetry, Telemetry
from leaseworker._telemetry import _trace as trace_module
from leaseworker._telemetry._lean import LeanTracerProvider
from leaseworker._telemetry._otlp_json import JsonSpanEncoder
from leaseworker._telemetry._span_batch import LeanBatchProcessor
from leaseworker._telemetry._trace import CURRENT, MAX_ACQUIRE_EVENTS

COMMON = (
    "messaging.system",
    "messaging.operation.name",
    "messaging.operation.type",
    "messaging.destination.name",
    "messaging.destination.partition.id",
    "messaging.kafka.offset",
    "messaging.kafka.message.key",
    "messaging.consumer.group.name",
    "leaseworker.pod",
)
IDENTITY = ("leaseworker.job.key", "leaseworker.execution.id")

pytestmark = pytest.mark.fake  # fake Kafka records: no broker, no Redis


class FakeRecord(NamedTuple):
    """The fields of an aiokafka ``ConsumerRecord`` the hooks read."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


class FakeTopicPartition(NamedTuple):
    """aiokafka's ``TopicPartition``."""

    topic: str
    partition: int


class AtStart(SpanProcessor):
    """Notes every span's attributes when it starts."""

    def __init__(self) -> None:
        self.started: dict[int, dict[str, Any]] = {}

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Copy the attributes the span was started with."""
        context = span.get_span_context()
        self.started[context.span_id] = dict(span.attributes or {})


@pytest.fixture
def spans() -> Iterator[tuple[PodTelemetry, InMemorySpanExporter, AtStart]]:
    """A pod's hooks on an SDK provider, its exporter, and the at-start notes."""
    exporter, at_start = InMemorySpanExporter(), AtStart()
    provider = TracerProvider()
    provider.add_span_processor(at_start)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    pod = Telemetry(tracer_provider=provider).instrument(pod="pod-a", group="g")
    yield pod, exporter, at_start
    provider.shutdown()


def _trigger(offset: int) -> tuple[FakeRecord, Trigger]:
    record = FakeRecord("reports", 0, offset, b"report:1", b"{}", ())
    trigger = Trigger(
        topic="reports",
        partition=0,
        offset=offset,
        key="report:1",
        headers=(),
        timestamp=None,
        payload={},
    )
    return record, trigger


def _attempt(trigger: Trigger, execution_id: str) -> Attempt:
    return Attempt(
        trigger=trigger,
        job_key="report:1",
        input_version="v1",
        execution_id=execution_id,
        pod="pod-a",
    )


def _event(trigger: Trigger, event: Any, execution_id: str, **fields: Any) -> ExecutionEvent:
    return ExecutionEvent(event=event, attempt=_attempt(trigger, execution_id), **fields)


def _lease(trigger: Trigger, execution_id: str, name: Any, fence: int, **fields: Any) -> LeaseEvent:
    at = anyio.current_time()
    attempt = _attempt(trigger, execution_id)
    return LeaseEvent(name=name, key="report:1", fence=fence, at=at, attempt=attempt, **fields)


@contextlib.contextmanager
def _processing(pod: PodTelemetry, record: FakeRecord) -> Iterator[None]:
    """What the Kafka source tells its hooks around one record's processing."""
    pod(SourceEvent(name="processing", record=record))
    try:
        yield
    finally:
        pod(SourceEvent(name="processed", record=record))


def _by_name(exporter: InMemorySpanExporter) -> dict[str, list[ReadableSpan]]:
    named: dict[str, list[ReadableSpan]] = {}
    for span in exporter.get_finished_spans():
        named.setdefault(span.name, []).append(span)
    return named


async def test_busy_then_acquired_every_span_starts_with_identity_and_kafka_attributes(
    spans: tuple[PodTelemetry, InMemorySpanExporter, AtStart],
) -> None:
    """Busy once, then acquired, run, completion, release, commit: all attributes at start.

    ``lease acquire`` is one span over both tries, with the busy event and
    the acquiring execution's id and fence; ``job run`` covers the run.
    """
    pod, exporter, at_start = spans
    record, trigger = _trigger(41)
    with _processing(pod, record):
        pod(SourceEvent(name="received", record=record, trigger=trigger, job_key="report:1"))
        pod(_event(trigger, "acquiring", "e1"))
        pod(_event(trigger, "finished", "e1", outcome="busy"))
        pod(_event(trigger, "retry", "e1", retry_in=0.01))
        execution = "e2"
        pod(_event(trigger, "acquiring", execution))
        pod(_lease(trigger, execution, "acquired", 7, round_trip=0.001, remaining=9.0))
        pod(_event(trigger, "started", "e2", fence=7))
        pod(_lease(trigger, execution, "renewed", 7, round_trip=0.001, remaining=9.0))
        pod(_event(trigger, "completion", "e2", fence=7, reason="accepted"))
        pod(_lease(trigger, execution, "released", 7, round_trip=0.001, deleted=True))
        pod(_event(trigger, "finished", "e2", fence=7, outcome="completed"))
    pod(
        SourceEvent(
            name="committed",
            offsets={FakeTopicPartition("reports", 0): 42},
            began=anyio.current_time(),
        )
    )
    named = _by_name(exporter)
    assert sorted(named) == sorted(
        [
            "process reports",
            "trigger received",
            "lease acquire",
            "job run",
            "lease renew",
            "completion",
            "lease release",
            "commit reports",
        ]
    )
    for name, [span] in named.items():
        assert span.context is not None
        started = at_start.started[span.context.span_id]
        assert started["messaging.kafka.offset"] == 41, name
        for key in COMMON:
            assert key in started, (name, key)
        if name != "process reports":  # the job key is decoded after the record arrives
            for key in IDENTITY:
                assert key in started, (name, key)
        if name not in ("process reports", "trigger received"):
            assert started["leaseworker.fence"] == 7, name
    [acquire] = named["lease acquire"]
    attributes = dict(acquire.attributes or {})
    assert attributes["leaseworker.execution.id"] == "e2"
    assert attributes["leaseworker.outcome"] == "acquired"
    assert attributes["leaseworker.lease.busy_retries"] == 1
    assert [e.name for e in acquire.events] == ["busy", "retry"]
    [run] = named["job run"]
    assert dict(run.attributes or {})["leaseworker.outcome"] == "completed"
    assert (run.start_time or 0) <= (run.end_time or 0)
    [process] = named["process reports"]
    assert dict(process.attributes or {})["leaseworker.job.key"] == "report:1"
    assert dict(process.attributes or {})["leaseworker.outcome"] == "completed"


async def test_processing_ending_while_the_lease_is_busy_still_ends_the_acquire_span(
    spans: tuple[PodTelemetry, InMemorySpanExporter, AtStart],
) -> None:
    """Processing ends while the lease is busy: ``lease acquire`` ends with the last answer."""
    pod, exporter, _ = spans
    record, trigger = _trigger(5)
    with _processing(pod, record):
        pod(SourceEvent(name="received", record=record, trigger=trigger, job_key="report:1"))
        pod(_event(trigger, "acquiring", "e1"))
        pod(_event(trigger, "finished", "e1", outcome="busy"))
    named = _by_name(exporter)
    [acquire] = named["lease acquire"]
    attributes = dict(acquire.attributes or {})
    assert attributes["leaseworker.outcome"] == "busy"
    assert attributes["leaseworker.lease.busy_retries"] == 1
    assert attributes["leaseworker.execution.id"] == "e1"
    assert "job run" not in named


async def test_lost_lease_spans_carry_their_reason_and_error_status(
    spans: tuple[PodTelemetry, InMemorySpanExporter, AtStart],
) -> None:
    """A rejected renewal: error ``lease renew``, ``ownership lost``, cancel, stop, lost run."""
    pod, exporter, _ = spans
    record, trigger = _trigger(9)
    with _processing(pod, record):
        pod(SourceEvent(name="received", record=record, trigger=trigger, job_key="report:1"))
        execution = "e1"
        pod(_event(trigger, "acquiring", execution))
        pod(_lease(trigger, execution, "acquired", 3, round_trip=0.001, remaining=2.0))
        pod(_event(trigger, "started", "e1", fence=3))
        pod(_lease(trigger, execution, "lost", 3, reason="rejected"))
        pod(_lease(trigger, execution, "cancel_requested", 3, reason="rejected"))
        pod(_lease(trigger, execution, "stopped", 3, stop_latency=0.002))
        pod(_lease(trigger, execution, "released", 3, round_trip=0.001, deleted=False))
        pod(_event(trigger, "finished", "e1", fence=3, outcome="lost"))
    named = _by_name(exporter)
    [renew] = named["lease renew"]
    assert renew.status.status_code == StatusCode.ERROR
    assert dict(renew.attributes or {})["leaseworker.renewal.outcome"] == "rejected"
    [lost] = named["ownership lost"]
    assert lost.status.status_code == StatusCode.ERROR
    assert dict(lost.attributes or {})["leaseworker.loss.reason"] == "rejected"
    [stopped] = named["job stopped"]
    assert dict(stopped.attributes or {})["leaseworker.stop_latency_ms"] == 2.0
    assert (stopped.end_time or 0) - (stopped.start_time or 0) == 2_000_000  # exact: one clock read
    [run] = named["job run"]
    assert run.status.status_code == StatusCode.ERROR
    assert dict(run.attributes or {})["leaseworker.outcome"] == "lost"


async def test_a_long_busy_wait_keeps_a_bounded_number_of_acquire_events(
    spans: tuple[PodTelemetry, InMemorySpanExporter, AtStart],
) -> None:
    """A key busy for a thousand tries: every try is counted, the first 64 are span events.

    The events of the ``lease acquire`` span are kept until it ends; a trigger
    waiting for hours used to keep every busy and retry event in memory.
    """
    pod, exporter, _ = spans
    record, trigger = _trigger(9)
    with _processing(pod, record):
        pod(SourceEvent(name="received", record=record, trigger=trigger, job_key="report:1"))
        for attempt in range(1000):
            pod(_event(trigger, "acquiring", f"e{attempt}"))
            pod(_event(trigger, "finished", f"e{attempt}", outcome="busy"))
            pod(_event(trigger, "retry", f"e{attempt}", retry_in=0.01))
    [acquire] = _by_name(exporter)["lease acquire"]
    assert dict(acquire.attributes or {})["leaseworker.lease.busy_retries"] == 1000
    assert len(acquire.events) == MAX_ACQUIRE_EVENTS


async def test_a_sampled_out_busy_wait_keeps_no_acquire_events() -> None:
    """A trace that is not recorded makes no acquire span: its events are not kept either."""
    provider = TracerProvider(sampler=ALWAYS_OFF)
    pod = Telemetry(tracer_provider=provider).instrument(pod="pod-a", group="g")
    record, trigger = _trigger(10)
    with _processing(pod, record):
        pod(SourceEvent(name="received", record=record, trigger=trigger, job_key="report:1"))
        pod(_event(trigger, "acquiring", "e1"))
        for attempt in range(10):
            pod(_event(trigger, "finished", "e1", outcome="busy"))
            pod(_event(trigger, "retry", "e1", retry_in=0.01))
            trace = CURRENT.get()
            assert trace is not None
            assert trace.acquire_events == [], attempt


async def test_the_completion_span_is_placed_when_the_store_answered_not_when_reported(
    spans: tuple[PodTelemetry, InMemorySpanExporter, AtStart],
) -> None:
    """A completion reported a second after the store's answer ends at the answer.

    The executor reports it after the release (a paused pod may do so long
    after the store decided); the span covers the store call, ending at
    ``answered_at`` (the lease clock), as the history places it.
    """
    pod, exporter, _ = spans
    record, trigger = _trigger(12)
    answered = anyio.current_time() - 1.0  # the store answered a second before the event
    with _processing(pod, record):
        pod(SourceEvent(name="received", record=record, trigger=trigger, job_key="report:1"))
        pod(_event(trigger, "acquiring", "e1"))
        pod(_event(trigger, "started", "e1", fence=2))
        reported = time.time_ns()
        completion = _event(trigger, "completion", "e1", fence=2, reason="accepted", elapsed=0.25)
        pod(dataclasses.replace(completion, answered_at=answered))
        pod(_event(trigger, "finished", "e1", fence=2, outcome="completed"))
    [span] = _by_name(exporter)["completion"]
    start, end = span.start_time or 0, span.end_time or 0
    assert end - start == 250_000_000  # the store call's duration, exact
    assert 0.9e9 <= reported - end <= 1.1e9  # a second before it was reported


class _Encoding(SpanExporter):
    """Encodes each batch as the OTLP/JSON exporter would; ``takes_records`` as told."""

    def __init__(self, takes_records: bool) -> None:
        self.takes_records = takes_records
        self.kinds: list[type] = []
        self.spans: list[dict[str, Any]] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.kinds.extend(type(span) for span in spans)
        body = json.loads(JsonSpanEncoder().encode(spans))
        for resource in body["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                self.spans.extend(scope["spans"])
        return SpanExportResult.SUCCESS


def _one_trigger_encoded(takes_records: bool) -> _Encoding:
    """One trigger through a lean provider (the pod's sampler and batch processor)."""
    exporter = _Encoding(takes_records)
    provider = LeanTracerProvider(Resource.create({"service.name": "t"}), ParentBased(ALWAYS_ON))
    provider.add_span_processor(LeanBatchProcessor(exporter))
    pod = Telemetry(tracer_provider=provider).instrument(pod="pod-a", group="g")
    record, trigger = _trigger(41)
    with _processing(pod, record):
        pod(SourceEvent(name="received", record=record, trigger=trigger, job_key="report:1"))
        pod(_event(trigger, "acquiring", "e1"))
        pod(_event(trigger, "finished", "e1", outcome="busy"))
        pod(_event(trigger, "retry", "e1", retry_in=0.01))
        pod(_event(trigger, "acquiring", "e2"))
        pod(
            _lease(trigger, "e2", "acquired", 7, round_trip=0.001, remaining=9.0, previous=PREVIOUS)
        )
        pod(_event(trigger, "started", "e2", fence=7))
        pod(_event(trigger, "completion", "e2", fence=7, reason="stale", elapsed=0.002))
        pod(_lease(trigger, "e2", "release_failed", 7, round_trip=0.001, error=OSError()))
        pod(_event(trigger, "finished", "e2", fence=7, outcome="lost", reason="stale"))
    offsets = {FakeTopicPartition("reports", 0): 42}
    pod(SourceEvent(name="committed", offsets=offsets, began=anyio.current_time()))
    provider.shutdown()
    return exporter


async def test_the_acquire_span_never_ends_before_it_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its end is its start plus the wait, both read on the monotonic clock.

    Converting the acquire's monotonic time to a wall time reads two clocks;
    here every such conversion loses 5 ms between the reads, as a thread
    preempted there does on a loaded machine (there, an end came 3 ms before
    its start).
    """
    monkeypatch.setattr(trace_module, "monotonic_now", lambda: anyio.current_time() + 0.005)
    for takes_records in (True, False):
        [acquire] = [
            span
            for span in _one_trigger_encoded(takes_records).spans
            if span["name"] == "lease acquire"
        ]
        assert int(acquire["endTimeUnixNano"]) >= int(acquire["startTimeUnixNano"])


PREVIOUS = f"{7:032x}:{8:016x}:e0"
"""A predecessor's lease note: the acquire span links to its trace."""


async def test_child_spans_as_records_encode_as_the_same_spans() -> None:
    """The pod's pipeline takes child spans as records: the OTLP spans are the same.

    Every field of every span (events, a link, error statuses, kinds,
    attributes) but the ids and times (and the acquire's measured wait),
    which differ between runs; the children's parent is the process span
    in both.
    """
    records, spans = _one_trigger_encoded(True), _one_trigger_encoded(False)
    assert records.kinds.count(tuple) == 6  # every child; the process span is a span
    assert tuple not in spans.kinds

    def comparable(exported: _Encoding) -> list[dict[str, Any]]:
        [process] = [s for s in exported.spans if s["name"] == "process reports"]
        kept = []
        for span in exported.spans:
            assert int(span["endTimeUnixNano"]) >= int(span["startTimeUnixNano"]), span["name"]
            if span is not process:
                assert span["parentSpanId"] == process["spanId"], span["name"]
                assert span["traceId"] == process["traceId"], span["name"]
            times = ("spanId", "parentSpanId", "traceId", "startTimeUnixNano", "endTimeUnixNano")
            span = {key: value for key, value in span.items() if key not in times}
            span["attributes"] = [  # the acquire's wait is measured: it differs between runs
                pair for pair in span["attributes"] if pair["key"] != "leaseworker.lease.wait_ms"
            ]
            if "events" in span:
                span["events"] = [
                    {key: value for key, value in event.items() if key != "timeUnixNano"}
                    for event in span["events"]
                ]
            kept.append(span)
        return sorted(kept, key=lambda span: span["name"])

    assert comparable(records) == comparable(spans)
    [acquire] = [s for s in comparable(records) if s["name"] == "lease acquire"]
    assert [e["name"] for e in acquire["events"]] == ["busy", "retry"]
    assert len(acquire["links"]) == 1
