"""The lean batch processor: every sampled ended span is exported once, in order, in batches.

Pure unit tests (no collector): an exporter that records its batches stands
for OTLP; the export thread is awaited through events, never slept for.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Decision, Sampler, SamplingResult

from leaseworker._telemetry._lean import LeanTracerProvider
from leaseworker._telemetry._span_batch import (
    MAX_EXPORT_BATCH_SIZE,
    MAX_QUEUE_SIZE,
    SCHEDULE_DELAY_MILLIS,
    LeanBatchProcessor,
)

RESOURCE = Resource.create({"service.name": "batch-test"})
NEVER = 3_600_000  # a schedule delay no test waits for


class _Recording(SpanExporter):
    """Keeps each batch's span names; ``exported`` is set once ``expect`` spans came."""

    def __init__(self, expect: int = 0) -> None:
        self.batches: list[list[str]] = []
        self.expect = expect
        self.exported = threading.Event()
        self.shut = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.batches.append([span.name for span in spans])
        if self.expect and sum(map(len, self.batches)) >= self.expect:
            self.exported.set()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.shut = True


class _RecordOnly(Sampler):
    """Records spans without sampling them: they must not be exported."""

    def should_sample(self, *args: object, **kwargs: object) -> SamplingResult:
        return SamplingResult(Decision.RECORD_ONLY)

    def get_description(self) -> str:
        return "RecordOnly"


def _provider(processor: SpanProcessor, sampler: Sampler = ALWAYS_ON) -> LeanTracerProvider:
    provider = LeanTracerProvider(RESOURCE, sampler)
    provider.add_span_processor(processor)
    return provider


def _end(provider: LeanTracerProvider, *names: str) -> None:
    tracer = provider.get_tracer("test")
    for name in names:
        tracer.start_span(name).end()


def test_sampled_spans_are_exported_in_order_in_batches_of_the_batch_size() -> None:
    """A full batch wakes the thread; a flush exports the rest; unsampled spans never go."""
    exporter = _Recording(expect=4)
    processor = LeanBatchProcessor(
        exporter, max_queue_size=100, schedule_delay_millis=NEVER, max_export_batch_size=4
    )
    provider = _provider(processor)
    _end(provider, "a", "b", "c", "d")
    assert exporter.exported.wait(10), "a full batch did not wake the export thread"
    _end(provider, "e", "f")
    _end(_provider(processor, _RecordOnly()), "not sampled")
    assert processor.force_flush()
    assert exporter.batches == [["a", "b", "c", "d"], ["e", "f"]]
    processor.shutdown()
    assert exporter.shut
    _end(provider, "after shutdown")
    assert not processor.force_flush()
    assert sum(map(len, exporter.batches)) == 6


def test_a_full_queue_drops_the_oldest_spans_counts_and_logs_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Beyond ``max_queue_size`` the oldest go, as in the SDK; the next export says how many.

    The export thread is held in its first export, so at most two batches'
    worth of the eight spans can be kept, whenever it woke.
    """
    exporter = _Recording()
    release = threading.Event()
    export = exporter.export
    exporter.export = lambda spans: (release.wait(10), export(spans))[1]  # type: ignore[method-assign]
    processor = LeanBatchProcessor(
        exporter, max_queue_size=3, schedule_delay_millis=NEVER, max_export_batch_size=3
    )
    provider = _provider(processor)
    with caplog.at_level(logging.WARNING, "leaseworker.telemetry"):
        _end(provider, *"abcdefgh")
        release.set()
        processor.shutdown()  # the thread exports what is left, then stops
    exported = [name for batch in exporter.batches for name in batch]
    assert processor.dropped == len("abcdefgh") - len(exported) >= 2
    assert exported == sorted(exported)  # in order
    assert exported[-3:] == list("fgh")  # the newest kept
    assert "spans dropped" in caplog.text


def test_settings_come_from_otel_bsp_variables_else_the_larger_defaults(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``OTEL_BSP_*`` as in the SDK; a bad value falls back to the default with a warning."""
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "64")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "128")  # more than the queue
    processor = LeanBatchProcessor(_Recording())
    assert (processor.max_queue_size, processor.schedule_delay) == (64, 0.2)
    assert processor.max_export_batch_size == 64
    processor.shutdown()
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "lots")
    monkeypatch.delenv("OTEL_BSP_SCHEDULE_DELAY")
    monkeypatch.delenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE")
    with caplog.at_level(logging.WARNING, "leaseworker.telemetry"):
        processor = LeanBatchProcessor(_Recording())
    assert processor.max_queue_size == MAX_QUEUE_SIZE
    assert processor.schedule_delay == SCHEDULE_DELAY_MILLIS / 1000
    assert processor.max_export_batch_size == MAX_EXPORT_BATCH_SIZE
    assert "OTEL_BSP_MAX_QUEUE_SIZE='lots'" in caplog.text
    processor.shutdown()


class _Starting(SpanProcessor):
    def __init__(self) -> None:
        self.started: list[str] = []

    def on_start(self, span: object, parent_context: object = None) -> None:
        self.started.append(span.name)  # type: ignore[attr-defined]


def test_a_span_start_calls_only_processors_whose_on_start_does_something() -> None:
    """The lean processor's (the base class's no-op) is skipped; a real one is still called."""
    batch = LeanBatchProcessor(_Recording(), schedule_delay_millis=NEVER)
    starting = _Starting()
    provider = _provider(batch)
    provider.add_span_processor(starting)
    assert provider._starters == (starting,)
    _end(provider, "a")
    assert starting.started == ["a"]
    batch.shutdown()
