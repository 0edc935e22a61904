"""The batch span processor of leaseworker's own tracer provider (``leaseworker run``).

It does what the SDK's ``BatchSpanProcessor`` does (ended, sampled spans
queued, exported in batches from a daemon thread, ``OTEL_BSP_*`` honoured)
at less cost to the event loop, which ends seven spans per trigger: no
``on_start`` call, no ``getpid`` system call and no self-metrics per span,
only a deque append and a length check. Its defaults batch more (fewer,
larger posts) and queue more (a GIL-starved export thread drops no span).
It exports with instrumentation suppressed, through ``_export_seam`` (a
private API name). See docs/design.md#otlpjson-export.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
from typing import TYPE_CHECKING, final

from opentelemetry.context import attach, detach
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import TraceFlags

from ._export_seam import suppressing_instrumentation

if TYPE_CHECKING:
    from ._span_records import Record

logger = logging.getLogger("leaseworker.telemetry")

MAX_QUEUE_SIZE = 8_192
"""Ended spans waiting, at most: about 2 s of a busy pod and 12 MB (the SDK's 2,048: 0.5 s)."""
MAX_EXPORT_BATCH_SIZE = 2_048
"""Spans per export call (the SDK's: 512); the thread is woken once this many wait."""
SCHEDULE_DELAY_MILLIS = 5_000
"""The export thread's longest sleep with spans waiting (the SDK's default)."""

_SAMPLED = int(TraceFlags.SAMPLED)


def _env_int(name: str, default: int) -> int:
    """Return an ``OTEL_BSP_*`` setting: a positive integer, else ``default`` (with a warning)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        logger.warning("%s=%r is not a positive integer; using %d", name, raw, default)
        return default
    return value


@final
class LeanBatchProcessor(SpanProcessor):
    """Queues ended sampled spans; a daemon thread exports them in batches.

    ``max_queue_size``, ``schedule_delay_millis`` and ``max_export_batch_size``
    default to ``OTEL_BSP_MAX_QUEUE_SIZE``, ``OTEL_BSP_SCHEDULE_DELAY`` and
    ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``, else to this module's constants. A full
    queue drops its oldest span, as the SDK's does; drops are counted
    (:attr:`dropped`) and logged by the export thread. Not fork-safe: build it
    in the process that exports.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue_size: int | None = None,
        schedule_delay_millis: int | None = None,
        max_export_batch_size: int | None = None,
    ) -> None:
        self.exporter = exporter
        self.max_queue_size = max_queue_size or _env_int("OTEL_BSP_MAX_QUEUE_SIZE", MAX_QUEUE_SIZE)
        delay = schedule_delay_millis or _env_int("OTEL_BSP_SCHEDULE_DELAY", SCHEDULE_DELAY_MILLIS)
        self.schedule_delay = delay / 1000
        batch = max_export_batch_size or _env_int(
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", MAX_EXPORT_BATCH_SIZE
        )
        self.max_export_batch_size = min(batch, self.max_queue_size)
        self.dropped = 0
        self._reported = 0
        self._queue: collections.deque[ReadableSpan | Record] = collections.deque(
            maxlen=self.max_queue_size
        )
        self._wake = threading.Event()
        self._lock = threading.Lock()  # one export at a time: the thread's or a flush's
        self._shutdown = False
        self._thread = threading.Thread(
            target=self._run, name="leaseworker span export", daemon=True
        )
        self._thread.start()

    @property
    def takes_records(self) -> bool:
        """Whether the exporter takes span records as well as spans (see ``_span_records``)."""
        return bool(getattr(self.exporter, "takes_records", False))

    def on_end(self, span: ReadableSpan) -> None:
        """Queue ``span`` if it is sampled (called on the event loop: kept minimal)."""
        if not span.context.trace_flags & _SAMPLED:
            return
        self.take(span)

    def take(self, span: ReadableSpan | Record) -> None:
        """Queue a sampled span or span record for export."""
        if self._shutdown:
            return
        queue = self._queue
        if len(queue) == self.max_queue_size:
            self.dropped += 1  # the deque drops the oldest
        queue.append(span)
        if len(queue) >= self.max_export_batch_size and not self._wake.is_set():
            self._wake.set()

    def _run(self) -> None:
        while not self._shutdown:
            self._wake.wait(self.schedule_delay)
            self._wake.clear()
            if self._shutdown:
                break
            self._export()
        self._export()

    def _export(self) -> None:
        """Export what is queued now (not what comes meanwhile), a batch per exporter call."""
        with self._lock:
            queue = self._queue
            left = len(queue)
            while left > 0 and queue:
                count = min(left, len(queue), self.max_export_batch_size)
                left -= count
                batch = [queue.popleft() for _ in range(count)]
                token = attach(suppressing_instrumentation())  # as the SDK's processors
                try:
                    self.exporter.export(batch)  # type: ignore[arg-type]  # records: takes_records
                except Exception:
                    logger.exception("exporting %d spans failed", len(batch))
                finally:
                    detach(token)
            if self.dropped > self._reported:
                logger.warning(
                    "span queue full: %d spans dropped so far (OTEL_BSP_MAX_QUEUE_SIZE=%d)",
                    self.dropped,
                    self.max_queue_size,
                )
                self._reported = self.dropped

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export what is queued now, in the calling thread; False once shut down.

        As the SDK's, bounded by the exporter's own timeout, not ``timeout_millis``.
        """
        if self._shutdown:
            return False
        self._export()
        return True

    def shutdown(self, timeout_millis: int = 30000) -> None:
        """Export what is queued (waiting up to ``timeout_millis``), then shut the exporter down."""
        if self._shutdown:
            return
        self._shutdown = True
        self._wake.set()
        self._thread.join(timeout_millis / 1000)
        self.exporter.shutdown()
