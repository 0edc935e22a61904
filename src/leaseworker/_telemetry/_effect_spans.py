"""Effects as spans and metrics: ``publish {topic}`` in the execution, ``send {topic}`` relayed.

A job's ``publish()`` becomes a ``publish {topic}`` span, a child of the
trigger's ``process`` span, and the message carries that span's W3C trace
context: the relay's ``send {topic}`` span (partition, offset) is its child,
and so is a receiver's ``process`` span, so one trace runs from the trigger
to the receiver. The send span is made in the relay's task once the broker
answered, off the execution's path. The relay's backlog samples feed the
outbox gauges, inboxes' answers the ``received`` counter. Identifiers,
topics and fences only: never a payload, a message key or a header value.
"""

from __future__ import annotations

from typing import final

from opentelemetry import context as otel_context
from opentelemetry.trace import Link, SpanKind, Tracer, get_current_span, set_span_in_context

from .._events import EffectEvent
from .._execution import job_key_of
from . import _names as n
from ._metrics import Metrics
from ._propagation import extract, inject
from ._trace import CURRENT, Attributes, error_status, wall_ns


@final
class EffectSpans:
    """The part of a pod's telemetry that records :class:`~leaseworker.effects.EffectEvent` s."""

    def __init__(self, tracer: Tracer, metrics: Metrics, *, pod: str) -> None:
        self._tracer = tracer
        self._metrics = metrics
        self._pod = pod

    def on_event(self, event: EffectEvent) -> None:
        """Record one effect event (a failure is logged by the caller's ``emit``)."""
        name = event.name
        if name == "published":
            self._published(event)
        elif name in ("sent", "send_failed"):
            self._sent(event)
        elif name == "backlog":
            labels = {} if event.namespace is None else {n.NAMESPACE: event.namespace}
            for gauge in (self._metrics.outbox_depth, self._metrics.outbox_age):
                gauge.attributes = labels
            self._metrics.outbox_depth.value = event.depth  # None: another pod reports it
            age = None if event.depth is None else event.oldest_age or 0.0
            self._metrics.outbox_age.value = age
        elif name == "received":
            labels = {n.EFFECT_STATUS: event.status or "unknown", n.RECEIVER: event.receiver or ""}
            self._metrics.effects_received.add(1, labels)

    def _published(self, event: EffectEvent) -> None:
        """Make the ``publish`` span and write its context into the message's carrier."""
        if event.carrier is None or event.topic is None:
            return
        trace = CURRENT.get()
        parent = trace.parent if trace is not None else otel_context.get_current()
        if trace is not None and not trace.recording:  # sampled out: pass the decision on
            inject(event.carrier, parent)
            return
        attributes: Attributes = {
            n.MESSAGING_SYSTEM: "kafka",
            n.MESSAGING_OPERATION_NAME: "publish",
            n.MESSAGING_OPERATION_TYPE: "create",
            n.MESSAGING_DESTINATION: event.topic,
            n.POD: self._pod,
        }
        _identify(attributes, event)
        if event.attempt is not None:
            attributes[n.JOB_KEY] = event.attempt.job_key
            attributes[n.EXECUTION_ID] = event.attempt.execution_id
        span = self._tracer.start_span(
            n.publish_span_name(event.topic),
            context=parent,
            kind=SpanKind.PRODUCER,
            attributes=attributes,
        )
        inject(event.carrier, set_span_in_context(span))
        span.end()

    def _sent(self, event: EffectEvent) -> None:
        """Count the send; make its ``send`` span, child of (and linked to) the ``publish`` span."""
        topic = event.topic or ""
        failed = event.name == "send_failed"
        (self._metrics.send_failures if failed else self._metrics.effects_sent).add(
            1, {n.MESSAGING_DESTINATION: topic}
        )
        parent = extract(event.trace) if event.trace else otel_context.Context()
        published = get_current_span(parent).get_span_context()
        if published.is_valid and not published.trace_flags.sampled:
            return  # the execution's trace was sampled out: so is its message's
        attributes: Attributes = {
            n.MESSAGING_SYSTEM: "kafka",
            n.MESSAGING_OPERATION_NAME: "send",
            n.MESSAGING_OPERATION_TYPE: "send",
            n.MESSAGING_DESTINATION: topic,
            n.POD: self._pod,
        }
        _identify(attributes, event)
        if event.job_key is not None:
            attributes[n.JOB_KEY] = job_key_of(event.job_key)
        if event.relay is not None:
            attributes[n.RELAY] = event.relay
        if event.partition is not None:
            attributes[n.MESSAGING_PARTITION] = str(event.partition)
        if event.offset is not None:
            attributes[n.MESSAGING_OFFSET] = event.offset
        if event.error is not None:
            attributes[n.ERROR_TYPE] = type(event.error).__name__
        span = self._tracer.start_span(
            n.send_span_name(topic),
            context=parent,
            kind=SpanKind.PRODUCER,
            attributes=attributes,
            links=[Link(published)] if published.is_valid else (),
            start_time=wall_ns(event.began),
        )
        if event.error is not None:
            span.set_status(error_status(type(event.error).__name__))
        span.end()


def _identify(attributes: Attributes, event: EffectEvent) -> None:
    if event.effect_id is not None:
        attributes[n.EFFECT_ID] = event.effect_id
    if event.fence is not None:
        attributes[n.FENCE] = event.fence
