"""W3C trace context in Kafka headers: what the ``process`` span of a record hangs on."""

from __future__ import annotations

from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    TraceFlags,
    get_current_span,
    set_span_in_context,
)

from leaseworker._telemetry import inject
from leaseworker._telemetry._propagation import consumer_parent

PRODUCER = SpanContext(
    trace_id=0x0AF7651916CD43DD8448EB211C80319C,
    span_id=0x00F067AA0BA902B7,
    is_remote=False,
    trace_flags=TraceFlags(TraceFlags.SAMPLED),
)


def _headers_from_producer() -> list[tuple[str, bytes]]:
    headers: list[tuple[str, bytes]] = [("other", b"x")]
    inject(headers, set_span_in_context(NonRecordingSpan(PRODUCER)))
    return headers


def test_a_record_with_the_producers_traceparent_is_its_child_and_links_to_it() -> None:
    """One trace from the request to the report, and the link says where it came from."""
    parent, links = consumer_parent(_headers_from_producer())

    remote = get_current_span(parent).get_span_context()
    assert (remote.trace_id, remote.span_id, remote.is_remote) == (
        PRODUCER.trace_id,
        PRODUCER.span_id,
        True,
    )
    assert [link.context.span_id for link in links] == [PRODUCER.span_id]


def test_without_parenting_on_the_producer_a_record_starts_a_trace_that_links_to_it() -> None:
    """``parent_on_producer=False``: a trace per trigger, still linked to the producer."""
    parent, links = consumer_parent(_headers_from_producer(), parent_on_producer=False)

    assert not get_current_span(parent).get_span_context().is_valid
    assert [link.context.trace_id for link in links] == [PRODUCER.trace_id]


def test_a_record_without_headers_or_with_a_bad_traceparent_starts_a_trace_of_its_own() -> None:
    """No usable producer context: a new trace, no link (and no error)."""
    for headers in (None, [], [("traceparent", b"00-not-a-trace-01")]):
        parent, links = consumer_parent(headers)

        assert not get_current_span(parent).get_span_context().is_valid, headers
        assert links == [], headers
