"""One execution's lease events as child spans, metrics and log lines.

Each :class:`LeaseSpans` belongs to one execution (it knows the execution id,
which lease events do not carry) and hangs its spans on the trigger's trace:
``lease acquire`` ends when the lease is acquired; every renewal is a
``lease renew`` span covering its round trip; a loss gives ``ownership lost``
and ``cancel requested``; ``job stopped`` spans the time from the loss until the
body stopped; ``lease release`` covers the release round trip.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, final

from opentelemetry.trace import Span, Status, StatusCode, Tracer

from .. import _lease_events
from . import _names as n
from ._trace import TriggerTrace, ms, wall_ns

if TYPE_CHECKING:
    from ._metrics import Metrics

logger = logging.getLogger("leaseworker.lease")

RENEWAL_LOSSES = frozenset({"rejected", "timeout", "error", "late"})
"""Loss reasons that are the answer (or silence) of a renewal call."""


@final
class LeaseSpans:
    """A :class:`~leaseworker.LeaseObserver` for one execution; see the module docstring."""

    def __init__(
        self, tracer: Tracer, metrics: Metrics, trace: TriggerTrace, execution_id: str
    ) -> None:
        self._tracer = tracer
        self._metrics = metrics
        self._trace = trace
        self._execution_id = execution_id
        self._deadline: float | None = None  # local deadline after the last confirmation

    def on_lease_event(self, event: _lease_events.LeaseEvent) -> None:
        """Record one lease event (see :class:`~leaseworker.LeaseEvent`)."""
        handler = getattr(self, f"_on_{event.name}", None)
        if handler is None:
            self._span(f"lease {event.name.replace('_', ' ')}", event, event.at)
            return
        handler(event)

    def _on_acquired(self, event: _lease_events.LeaseEvent) -> None:
        trace = self._trace
        self._confirmed(event)
        span = trace.acquire
        trace.acquire = None
        trace.fence = event.fence
        if span is None:
            return
        span.set_attributes(
            {
                n.EXECUTION_ID: self._execution_id,
                n.FENCE: event.fence,
                n.OUTCOME: "acquired",
                n.BUSY_RETRIES: trace.busy,
                n.WAIT_MS: ms(event.at - trace.acquire_began),
                n.ROUND_TRIP_MS: ms(event.round_trip or 0.0),
                n.REMAINING_MS: ms(event.remaining or 0.0),
            }
        )
        span.end(wall_ns(event.at))

    def _on_renewed(self, event: _lease_events.LeaseEvent) -> None:
        self._confirmed(event)
        round_trip = event.round_trip or 0.0
        self._metrics.renewal.record(round_trip, {n.RENEWAL_OUTCOME: "renewed"})
        span = self._span(n.SPAN_RENEW, event, event.at - round_trip)
        span.set_attributes(
            {
                n.RENEWAL_OUTCOME: "renewed",
                n.ROUND_TRIP_MS: ms(round_trip),
                n.REMAINING_MS: ms(event.remaining or 0.0),
            }
        )
        span.end(wall_ns(event.at))
        logger.debug(
            "lease renewed for %r",
            event.key,
            extra=self._fields(event, renewalOutcome="renewed", roundTripMs=ms(round_trip)),
        )

    def _on_lost(self, event: _lease_events.LeaseEvent) -> None:
        reason = event.reason or "unknown"
        self._metrics.losses.add(1, {n.LOSS_REASON: reason})
        if reason in RENEWAL_LOSSES:
            renew = self._span(n.SPAN_RENEW, event, event.at)
            renew.set_attribute(n.RENEWAL_OUTCOME, reason)
            renew.set_status(Status(StatusCode.ERROR, f"renewal {reason}"))
            renew.end(wall_ns(event.at))
        span = self._span(n.SPAN_LOST, event, event.at)
        span.set_attribute(n.LOSS_REASON, reason)
        span.set_status(Status(StatusCode.ERROR, f"ownership lost: {reason}"))
        span.end(wall_ns(event.at))
        outcome = reason if reason in RENEWAL_LOSSES else None
        logger.info(
            "ownership of %r lost (%s); cancelling execution %s",
            event.key,
            reason,
            self._execution_id,
            extra=self._fields(event, reason=reason, renewalOutcome=outcome),
        )

    def _on_cancel_requested(self, event: _lease_events.LeaseEvent) -> None:
        span = self._span(n.SPAN_CANCEL, event, event.at)
        span.set_attribute(n.LOSS_REASON, event.reason or "unknown")
        span.end(wall_ns(event.at))

    def _on_stopped(self, event: _lease_events.LeaseEvent) -> None:
        latency = event.stop_latency or 0.0
        self._metrics.stop_latency.record(latency)
        if self._deadline is not None and event.at > self._deadline:
            # Past the local deadline another pod may hold the lease: possible overlap.
            self._metrics.overlap.add(event.at - self._deadline)
        span = self._span(n.SPAN_STOPPED, event, event.at - latency)
        span.set_attribute(n.STOP_LATENCY_MS, ms(latency))
        span.end(wall_ns(event.at))
        logger.warning(
            "job %r stopped %.1f ms after losing ownership",
            event.key,
            latency * 1000,
            extra=self._fields(event, stopLatencyMs=ms(latency)),
        )

    def _on_released(self, event: _lease_events.LeaseEvent) -> None:
        round_trip = event.round_trip or 0.0
        span = self._span(n.SPAN_RELEASE, event, event.at - round_trip)
        span.set_attributes(
            {n.RELEASE_DELETED: bool(event.deleted), n.ROUND_TRIP_MS: ms(round_trip)}
        )
        span.end(wall_ns(event.at))

    def _on_release_failed(self, event: _lease_events.LeaseEvent) -> None:
        round_trip = event.round_trip or 0.0
        span = self._span(n.SPAN_RELEASE, event, event.at - round_trip)
        span.set_attributes({n.RELEASE_DELETED: False, n.ROUND_TRIP_MS: ms(round_trip)})
        span.set_attribute(n.ERROR_TYPE, type(event.error).__name__)
        span.set_status(Status(StatusCode.ERROR, "release failed"))
        span.end(wall_ns(event.at))

    def _confirmed(self, event: _lease_events.LeaseEvent) -> None:
        if event.remaining is not None:
            self._deadline = event.at + event.remaining

    def _span(self, name: str, event: _lease_events.LeaseEvent, start: float) -> Span:
        """Start a child span of the trigger at monotonic time ``start`` (caller ends it)."""
        return self._tracer.start_span(
            name,
            context=self._trace.parent,
            attributes=self._trace.attributes(execution_id=self._execution_id, fence=event.fence),
            start_time=wall_ns(start),
        )

    def _fields(self, event: _lease_events.LeaseEvent, **extra: object) -> dict[str, object]:
        return {
            "jobId": event.key,
            "executionId": self._execution_id,
            "pod": self._trace.pod,
            "event": f"lease_{event.name}",
            "fence": event.fence,
            **extra,
        }
