"""One execution's lease events as child spans, metrics and log lines.

Each :class:`LeaseSpans` belongs to one execution (it knows the execution id,
which lease events do not carry) and hangs its spans on the trigger's trace:
``lease acquire`` ends when the lease is acquired; every renewal is a
``lease renew`` span covering its round trip (a failed one, from sending it to
the verdict); a loss gives ``ownership lost``
and ``cancel requested``; ``job stopped`` spans the time from the loss until the
body stopped; ``lease release`` covers the release round trip.

Each acquisition leaves its trace reference with the lease (:meth:`LeaseSpans.lease_note`);
the next execution of the key gets it back, and its ``lease acquire`` span links
to the previous execution's trace and names its execution id.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, final

from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceFlags, Tracer

from .._lease import LeaseEvent
from .._outcome import JOB_FAILURES, LeaseLostReason
from . import _names as n
from ._span_records import end_child
from ._trace import Attributes, TriggerTrace, ms, wall_ns

if TYPE_CHECKING:
    from ._metrics import Metrics

logger = logging.getLogger("leaseworker.lease")

RENEWAL_LOSSES: frozenset[LeaseLostReason] = frozenset({"rejected", "timeout", "error", "late"})
"""Loss reasons that are the answer (or silence) of a renewal call."""

ERROR_OUTCOMES: frozenset[str] = frozenset({*JOB_FAILURES, "lost", "malformed"})
"""Outcomes that make a ``job run`` (or an unfinished ``lease acquire``) span an error.

The dead-lettered failures, a loss, and a trigger's ``malformed`` (not an
execution's outcome: the record never became a job).
"""

_RELEASE_FAILED = Status(StatusCode.ERROR, "release failed")


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

    def lease_note(self) -> str:
        """Return ``trace id:span id:execution id`` of this execution, for its successor.

        The span is the trigger's ``process`` span (the only one that exists when
        the acquire is sent); without a recorded one the ids are left empty.
        """
        span = self._trace.span
        if span is None or not self._trace.recording:
            return f"::{self._execution_id}"
        context = span.get_span_context()
        return f"{context.trace_id:032x}:{context.span_id:016x}:{self._execution_id}"

    def on_lease_event(self, event: LeaseEvent) -> None:
        """Record one lease event (see :class:`~leaseworker.LeaseEvent`)."""
        handler = getattr(self, f"_on_{event.name}", None)
        if handler is None:
            self._span(f"lease {event.name.replace('_', ' ')}", event, event.at)
            return
        handler(event)

    def _on_acquired(self, event: LeaseEvent) -> None:
        trace = self._trace
        self._confirmed(event)
        trace.fence = event.fence
        if not trace.acquiring:
            return
        if not trace.recording:  # sampled out: end the wait, no span to describe
            end_acquire(self._tracer, trace, {}, 0, "acquired")
            return
        waited = max(0.0, event.at - trace.acquire_began)
        step: Attributes = {
            n.EXECUTION_ID: self._execution_id,
            n.FENCE: event.fence,
            n.OUTCOME: "acquired",
            n.WAIT_MS: ms(waited),
            n.ROUND_TRIP_MS: ms(event.round_trip or 0.0),
            n.REMAINING_MS: ms(event.remaining or 0.0),
        }
        link, previous_execution = _previous(event.previous)
        if previous_execution:
            step[n.PREVIOUS_EXECUTION_ID] = previous_execution
        # The end from the start and the wait, both of the monotonic clock: converting
        # event.at by itself reads two clocks, and a thread preempted between the reads
        # (a loaded machine, 3 ms) put the end before the start.
        end_ns = trace.acquire_started_ns + int(waited * 1e9)
        end_acquire(self._tracer, trace, step, end_ns, "acquired", link)

    def _on_renewed(self, event: LeaseEvent) -> None:
        self._confirmed(event)
        round_trip = event.round_trip or 0.0
        self._metrics.renewal.record(round_trip, {n.RENEWAL_OUTCOME: "renewed"})
        self._span(
            n.SPAN_RENEW,
            event,
            event.at - round_trip,
            {
                n.RENEWAL_OUTCOME: "renewed",
                n.ROUND_TRIP_MS: ms(round_trip),
                n.REMAINING_MS: ms(event.remaining or 0.0),
            },
        )
        logger.debug(
            "lease renewed for %r",
            event.key,
            extra=self._fields(event, renewalOutcome="renewed", roundTripMs=ms(round_trip)),
        )

    def _on_lost(self, event: LeaseEvent) -> None:
        reason = event.reason or "unknown"
        self._metrics.losses.add(1, {n.LOSS_REASON: reason})
        if reason in RENEWAL_LOSSES:
            self._span(
                n.SPAN_RENEW,
                event,
                event.at - (event.round_trip or 0.0),  # from sending it to the verdict
                {n.RENEWAL_OUTCOME: reason},
                Status(StatusCode.ERROR, f"renewal {reason}"),
            )
        self._span(
            n.SPAN_LOST,
            event,
            event.at,
            {n.LOSS_REASON: reason},
            Status(StatusCode.ERROR, f"ownership lost: {reason}"),
        )
        outcome = reason if reason in RENEWAL_LOSSES else None
        # DEBUG, like the stop below: the execution's ``finished`` record is the
        # loss's one WARNING (it carries the reason and the stop latency too).
        logger.debug(
            "ownership of %r lost (%s); cancelling execution %s",
            event.key,
            reason,
            self._execution_id,
            extra=self._fields(event, reason=reason, renewalOutcome=outcome),
        )

    def _on_cancel_requested(self, event: LeaseEvent) -> None:
        self._span(n.SPAN_CANCEL, event, event.at, {n.LOSS_REASON: event.reason or "unknown"})

    def _on_stopped(self, event: LeaseEvent) -> None:
        latency = event.stop_latency or 0.0
        self._metrics.stop_latency.record(latency)
        if self._deadline is not None and event.at > self._deadline:
            # Past the local deadline another pod may hold the lease: possible overlap.
            self._metrics.overlap.add(event.at - self._deadline)
        self._span(n.SPAN_STOPPED, event, event.at - latency, {n.STOP_LATENCY_MS: ms(latency)})
        logger.debug(
            "job %r stopped %.1f ms after losing ownership",
            event.key,
            latency * 1000,
            extra=self._fields(event, stopLatencyMs=ms(latency)),
        )

    def _on_released(self, event: LeaseEvent) -> None:
        round_trip = event.round_trip or 0.0
        self._span(
            n.SPAN_RELEASE,
            event,
            event.at - round_trip,
            {n.RELEASE_DELETED: bool(event.deleted), n.ROUND_TRIP_MS: ms(round_trip)},
        )

    def _on_release_failed(self, event: LeaseEvent) -> None:
        round_trip = event.round_trip or 0.0
        self._span(
            n.SPAN_RELEASE,
            event,
            event.at - round_trip,
            {
                n.RELEASE_DELETED: False,
                n.ROUND_TRIP_MS: ms(round_trip),
                n.ERROR_TYPE: type(event.error).__name__,
            },
            _RELEASE_FAILED,
        )

    def _confirmed(self, event: LeaseEvent) -> None:
        if event.remaining is not None:
            self._deadline = event.at + event.remaining

    def _span(
        self,
        name: str,
        event: LeaseEvent,
        start: float,
        step: Attributes | None = None,
        status: Status | None = None,
    ) -> None:
        """Record a child span of the trigger from monotonic ``start`` to the event.

        The step's attributes go in with the common ones when the span starts
        (one SDK attribute check per span instead of one per call).
        """
        if not self._trace.recording:
            return
        attributes = self._trace.own(execution_id=self._execution_id, fence=event.fence)
        if step:
            attributes.update(step)
        # One conversion to wall time: two would each read both clocks, and a
        # preemption between those reads would skew the span's duration.
        end = wall_ns(event.at)
        begin = end - max(0, round((event.at - start) * 1e9))
        end_child(self._tracer, self._trace, name, attributes, begin, end, status=status)

    def _fields(self, event: LeaseEvent, **extra: object) -> dict[str, object]:
        return {
            "jobId": event.key,
            "executionId": self._execution_id,
            "pod": self._trace.pod,
            "event": f"lease_{event.name}",
            "fence": event.fence,
            **extra,
        }


def _previous(note: str | None) -> tuple[Link | None, str]:
    """Parse a predecessor's :meth:`LeaseSpans.lease_note`: a link to its trace, its execution id.

    A note that is not one (another writer, a newer format) gives neither.
    """
    parts = (note or "").split(":")
    if len(parts) != 3:
        return None, ""
    trace_id, span_id, execution_id = parts
    try:
        context = SpanContext(
            int(trace_id, 16),
            int(span_id, 16),
            is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
    except ValueError:  # no ids: the predecessor's trace was not recorded
        return None, execution_id
    if not context.is_valid:
        return None, execution_id
    return Link(context, {n.EXECUTION_ID: execution_id}), execution_id


def end_acquire(
    tracer: Tracer,
    trace: TriggerTrace,
    step: Attributes,
    end_ns: int,
    outcome: str,
    link: Link | None = None,
) -> None:
    """Record the trigger's ``lease acquire`` span, from the first try to ``end_ns``.

    It is made when the wait ends (acquired, given up, cancelled), with every
    attribute at its start and the busy/retry events noted meanwhile: one
    span start instead of a span kept open and updated call by call. ``link``
    leads to the execution whose lease this one took over.
    """
    trace.acquiring = False
    if not trace.recording:
        trace.acquire_events.clear()
        return
    attributes = trace.own(execution_id=trace.acquire_execution_id)
    attributes[n.BUSY_RETRIES] = trace.busy
    attributes.update(step)
    events, trace.acquire_events = trace.acquire_events, []
    end_child(
        tracer,
        trace,
        n.SPAN_ACQUIRE,
        attributes,
        trace.acquire_started_ns,
        end_ns,
        status=Status(StatusCode.ERROR, outcome) if outcome in ERROR_OUTCOMES else None,
        events=events,
        links=(link,) if link is not None else (),
    )
