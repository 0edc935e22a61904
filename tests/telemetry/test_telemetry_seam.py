"""The exporter seam: the fast path on the OpenTelemetry it was read from, else the public path.

``_export_seam`` holds every OpenTelemetry name beyond the public API that the
span export uses. With the pinned releases the set-up takes the fast path (the
lean batch processor, span records, OTLP/JSON, the collector asked at start);
with another release, or without one of those names, it stands down to the
SDK's batch processor and protobuf exporter with one WARNING, and a trigger's
spans still reach the collector. A local HTTP server stands for the collector.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence

import anyio
import opentelemetry.context
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from leaseworker._events import SourceEvent
from leaseworker._telemetry import ConfiguredTelemetry, _export_seam, configure
from leaseworker._telemetry._lean import LeanTracerProvider
from leaseworker._telemetry._otlp_json import OtlpJsonSpanExporter
from leaseworker._telemetry._span_batch import LeanBatchProcessor

from .test_telemetry_hooks import (
    PREVIOUS,
    FakeTopicPartition,
    _event,
    _lease,
    _processing,
    _trigger,
)
from .test_telemetry_setup import _Collector, _collector

TRIGGER_SPANS = {
    "process reports",
    "trigger received",
    "lease acquire",
    "job run",
    "completion",
    "lease release",
    "commit reports",
}
"""The spans of the trigger :func:`_one_trigger` feeds the hooks."""


@pytest.fixture
def otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spans only (no metrics), OTLP/JSON asked for, and no warning given yet."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "5")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    monkeypatch.setattr(_export_seam, "_STOOD_DOWN", set())


def _one_trigger(configured: ConfiguredTelemetry) -> None:
    """Feed one trigger's events (busy once, acquired, run, completion, release, commit)."""
    pod = configured.telemetry.instrument(pod="pod-a", group="g")
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
        pod(_event(trigger, "completion", "e2", fence=7, reason="accepted", elapsed=0.002))
        pod(_lease(trigger, "e2", "released", 7, round_trip=0.001))
        pod(_event(trigger, "finished", "e2", fence=7, outcome="completed"))
    offsets = {FakeTopicPartition("reports", 0): 42}
    pod(SourceEvent(name="committed", offsets=offsets, began=anyio.current_time()))


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_the_tested_opentelemetry_takes_the_fast_path_without_a_warning(
    otel_env: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Pinned releases: lean processor, records, OTLP/JSON, the collector asked first."""
    assert _export_seam.misfits() == []
    with _collector() as port, caplog.at_level(logging.WARNING, "leaseworker.telemetry"):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
        configured = configure(pod="pod-a", check_collector=True)
        provider = configured.tracer_provider
        assert isinstance(provider, LeanTracerProvider)
        [processor] = provider.processors
        assert isinstance(processor, LeanBatchProcessor)
        assert isinstance(processor.exporter, OtlpJsonSpanExporter)
        assert provider.takes_records
        _one_trigger(configured)
        configured.close(timeout=5)
    assert _warnings(caplog) == []
    check, *posts = _Collector.received
    assert check[2] == b"{}"  # the start-up check: an empty JSON export request
    assert {headers["content-type"] for _, headers, _ in posts} == {"application/json"}
    names = [
        span["name"]
        for _, _, body in posts
        for resource in json.loads(body)["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
    ]
    assert sorted(names) == sorted(TRIGGER_SPANS)


@pytest.mark.parametrize("away", ["release", "private name"])
async def test_an_untested_opentelemetry_stands_down_to_the_public_path_with_one_warning(
    away: str,
    otel_env: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another SDK release, or the suppression key gone: the SDK's own pipeline, one WARNING.

    Set up twice (a process configures once; the warning is given once):
    each time the SDK's batch processor posts protobuf, no span is a record,
    the collector is not asked first, and a trigger's spans all arrive.
    """
    if away == "release":
        installed = _export_seam.installed_version

        def newer_sdk(distribution: str) -> str | None:
            return "1.99.0" if distribution == "opentelemetry-sdk" else installed(distribution)

        monkeypatch.setattr(_export_seam, "installed_version", newer_sdk)
        misfit = "opentelemetry-sdk 1.99.0"
    else:
        monkeypatch.delattr(opentelemetry.context, "_SUPPRESS_INSTRUMENTATION_KEY")
        misfit = "opentelemetry.context has no _SUPPRESS_INSTRUMENTATION_KEY"
    assert _export_seam.misfits() == [misfit]
    with _collector() as port, caplog.at_level(logging.WARNING, "leaseworker.telemetry"):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
        for _ in range(2):
            configured = configure(pod="pod-a", check_collector=True)
            provider = configured.tracer_provider
            assert isinstance(provider, LeanTracerProvider)
            [processor] = provider.processors
            assert type(processor) is BatchSpanProcessor
            assert not provider.takes_records
            _one_trigger(configured)
            configured.close(timeout=5)
        received = list(_Collector.received)
    [warning] = _warnings(caplog)
    assert warning.startswith(f"{misfit}: not the OpenTelemetry 1.45")
    assert "OTLP/protobuf" in warning
    assert {path for path, _, _ in received} == {"/v1/traces"}
    assert {headers["content-type"] for _, headers, _ in received} == {"application/x-protobuf"}
    assert all(body for _, _, body in received)  # no empty check request
    names: list[str] = []
    for _, _, body in received:
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                names.extend(span.name for span in scope.spans)
    assert sorted(names) == sorted([*TRIGGER_SPANS, *TRIGGER_SPANS])


class _Suppressed(SpanExporter):
    """Notes whether instrumentation was suppressed while each batch was exported."""

    def __init__(self) -> None:
        self.suppressed: list[object] = []
        self.exported = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        key = opentelemetry.context._SUPPRESS_INSTRUMENTATION_KEY
        self.suppressed.append(opentelemetry.context.get_value(key))
        self.exported.set()
        return SpanExportResult.SUCCESS


def test_the_lean_processor_exports_with_instrumentation_suppressed() -> None:
    """As the SDK's processors do: an instrumented HTTP client traces no export post."""
    exporter = _Suppressed()
    processor = LeanBatchProcessor(exporter, schedule_delay_millis=3_600_000)
    provider = LeanTracerProvider(Resource.create({"service.name": "t"}), ALWAYS_ON)
    provider.add_span_processor(processor)
    provider.get_tracer("t").start_span("a").end()
    assert processor.force_flush()
    processor.shutdown()
    assert exporter.suppressed == [True]
    assert (
        opentelemetry.context.get_value(opentelemetry.context._SUPPRESS_INSTRUMENTATION_KEY) is None
    )
