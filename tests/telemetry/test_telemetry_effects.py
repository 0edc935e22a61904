"""Effects seen and measured: the publish and relay spans, the trace context, the metrics.

The first test runs a real pod (real Kafka, real Redis, ``memory://`` store)
whose job publishes one message: the message on the broker carries the
execution's trace context (its ``publish`` span, not the trigger's
producer), the relay's ``send`` span is that span's child with the
partition and offset the broker gave, and ``leaseworker.effects.sent``
counts it. The others drive the relay with a fake sender and an inbox
directly (the backlog gauges, the receivers' counter).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import anyio
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind, StatusCode, get_current_span

from leaseworker import JobContext, Pod, ReportJob, open_store
from leaseworker._store import effect_store
from leaseworker._telemetry import Telemetry, extract, traced_send
from leaseworker._timeline import Span, history_from_spans, render_html, render_text
from leaseworker.effects import Effect, EffectEvent, MemoryInbox, Relay
from leaseworker.testing import JobEnvironment, make_trigger
from leaseworker.toolkit import History
from leaseworker_dev._services import LocalKafka, LocalRedis

from ..effects.test_relay import FakeSender, commit
from ..jobs import on_topic
from ..kafka_util import KafkaNames, payload, read_topic
from ..worker_util import pod_config, running, until
from . import test_telemetry as base
from . import test_telemetry_hooks as hooks
from .test_telemetry import SECRET, _assert_no_payload, _attrs, _ctx, _points, named, send

# The fixtures of test_telemetry.py (injected providers, exporter, metric reader), shared.
exporter = base.exporter
metric_reader = base.metric_reader
providers = base.providers
producer_spans = base.producer_spans
telemetry = base.telemetry
topic = base.topic


class Publishing(ReportJob):
    """Publishes one message to ``effects`` (with the payload's secret) and completes."""

    topic = "set-per-test"

    def __init__(self, effects: str) -> None:
        self.effects = effects

    async def run(self, ctx: JobContext) -> object:
        """Publish, then return: the message commits with the completion."""
        ctx.publish(self.effects, {"secret": ctx.trigger.payload.get("secret")}, key=ctx.job_key)
        return {"ok": True}


async def test_the_message_carries_the_executions_trace_and_the_relay_span_is_its_child(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    exporter: InMemorySpanExporter,
    metric_reader: InMemoryMetricReader,
    telemetry: Telemetry,
    producer_spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """Producer -> process -> publish -> send (relay), one trace; the record names publish.

    Before this, a message carried the trigger's ``traceparent`` (the
    producer's span): a receiver's trace hung on the producer, not on the
    execution that committed the message.
    """
    trigger_topic, key = kafka_names.topic, "report:acme:2026-11"
    effects = f"reports.ready.{kafka_names.group}"
    kafka_server.create_topics([effects])
    producer_provider, producer_exporter = producer_spans
    with traced_send(trigger_topic, key, producer_provider) as outgoing:
        await send(
            kafka_server.bootstrap_servers,
            trigger_topic,
            key,
            payload(secret=SECRET),
            outgoing.headers,
        )
    [producer] = producer_exporter.get_finished_spans()
    job = on_topic(Publishing, trigger_topic)(effects)
    config = pod_config(kafka_server, redis_server, kafka_names, namespace, store_url="memory://")
    async with running(Pod(job, config, telemetry=telemetry)):
        # A bound, not a pace: the relay's producer connects on its first message.
        await until(lambda: bool(named(_spans(exporter), f"send {effects}")), within=60)
    [record] = await read_topic(kafka_server.bootstrap_servers, effects, 1)
    spans = _spans(exporter)
    by_id = {_ctx(s).span_id: s for s in spans}
    # From the message back: its send span, that span's parent (publish) and its parent.
    # (A loaded machine may lose a renewal and run the job twice: only one commits.)
    [relayed] = [
        s for s in named(spans, f"send {effects}") if s.status.status_code != StatusCode.ERROR
    ]
    assert relayed.parent is not None
    publish = by_id[relayed.parent.span_id]
    assert publish.name == f"publish {effects}"
    assert publish.parent is not None
    process = by_id[publish.parent.span_id]
    assert process.name == f"process {trigger_topic}"
    assert publish.kind == relayed.kind == SpanKind.PRODUCER
    carried = _remote(record.headers)
    assert carried.span_id != _ctx(producer).span_id  # the execution's, not the trigger's
    assert (carried.trace_id, carried.span_id) == (_ctx(publish).trace_id, _ctx(publish).span_id)
    assert [link.context.span_id for link in relayed.links] == [_ctx(publish).span_id]
    assert _ctx(relayed).trace_id == _ctx(process).trace_id
    sent = _attrs(relayed)
    assert sent["messaging.destination.partition.id"] == str(record.partition)
    assert sent["messaging.kafka.offset"] == record.offset
    assert sent["leaseworker.job.key"] == key
    effect_id = dict(record.headers)["leaseworker-effect-id"].decode()
    assert sent["leaseworker.effect.id"] == _attrs(publish)["leaseworker.effect.id"] == effect_id
    assert (
        _attrs(publish)["leaseworker.execution.id"] == _attrs(process)["leaseworker.execution.id"]
    )
    _assert_no_payload(spans)
    [point] = _points(metric_reader, "leaseworker.effects.sent")
    assert point.value == 1
    assert dict(point.attributes) == {"messaging.destination.name": effects}
    # The timeline marks when the effect was committed (the accepted completion) and sent.
    as_read = [_as_timeline(s) for s in spans]
    # Jaeger's classic /api/traces keeps the send span's link to its parent, not the parent.
    as_jaeger_v1 = [replace(s, parent_span_id=None) if s.links else s for s in as_read]
    committing = _attrs(publish)["leaseworker.execution.id"]
    [execution] = [
        e for e in history_from_spans(as_read, key).executions if e.execution_id == committing
    ]
    [again] = [
        e for e in history_from_spans(as_jaeger_v1, key).executions if e.execution_id == committing
    ]
    assert again.steps == execution.steps
    [completion] = [s for s in execution.steps if s.name == "completion"]
    [committed] = [s for s in execution.steps if s.name == "effect_committed"]
    [delivered] = [s for s in execution.steps if s.name == "effect_sent"]
    assert committed.at == completion.at
    assert committed.attrs["effect_id"] == delivered.attrs["effect_id"] == effect_id
    assert (delivered.attrs["partition"], delivered.attrs["offset"]) == ("0", record.offset)
    assert delivered.at >= committed.at
    text = render_text(History(executions=(execution,)), width=140)
    assert f"effect sent       {effect_id} to {effects} at 0:{record.offset}" in text
    assert "m effect sent" in text
    assert 'class="step step-effect_sent' in render_html(History(executions=(execution,)))


def _as_timeline(span: Any) -> Span:
    """An exported span as the timeline reads one from Jaeger."""
    return Span(
        trace_id=f"{span.context.trace_id:032x}",
        span_id=f"{span.context.span_id:016x}",
        name=span.name,
        start=span.start_time / 1e9,
        end=span.end_time / 1e9,
        attributes=dict(span.attributes or {}),
        parent_span_id=None if span.parent is None else f"{span.parent.span_id:016x}",
        links=tuple(
            (f"{ln.context.trace_id:032x}", f"{ln.context.span_id:016x}") for ln in span.links
        ),
        error=span.status.status_code == StatusCode.ERROR,
    )


def _spans(exporter: InMemorySpanExporter) -> list[Any]:
    return list(exporter.get_finished_spans())


def _remote(headers: Any) -> Any:
    return get_current_span(extract(headers)).get_span_context()


async def test_the_relay_reports_its_backlog_and_sends_through_the_one_hook_seam() -> None:
    """Two messages committed: the first round's sample says 2 unsent; once sent, 0."""
    events: list[EffectEvent] = []
    stop = anyio.Event()

    def hook(event: Any) -> None:
        events.append(event)
        if event.name == "backlog" and event.depth == 0 and len(events) > 1:
            stop.set()

    hook.accepts = (EffectEvent,)  # type: ignore[attr-defined]
    async with open_store("memory://") as opened:
        store = effect_store(opened)
        await commit(store, "ns:{k1}", 1, b"one", b"two")
        relay = Relay(store, FakeSender(), name="relay-a", hooks=[hook], backlog_every=0.0)
        with anyio.fail_after(10):
            await relay.run(stop)
    backlog = [e for e in events if e.name == "backlog"]
    assert backlog[0].depth == 2
    assert backlog[0].oldest_age is not None
    assert backlog[0].oldest_age >= 0
    assert (backlog[-1].depth, backlog[-1].oldest_age) == (0, None)
    sent = [e for e in events if e.name == "sent"]
    assert [(e.job_key, e.fence, e.offset) for e in sent] == [("ns:{k1}", 1, 0), ("ns:{k1}", 1, 1)]
    assert all(e.began is not None and e.elapsed >= 0 for e in sent)


async def test_the_outbox_gauges_and_the_receivers_counter(
    metric_reader: InMemoryMetricReader, telemetry: Telemetry
) -> None:
    """A pod's telemetry as an inbox's hook counts new, duplicate and stale effects."""
    pod = telemetry.instrument(pod="billing-1")
    inbox = MemoryInbox("billing", hooks=[pod])
    old = Effect(effect_id="lw1:a:0", job_key="ns:{k}", fence=1)
    new = Effect(effect_id="lw1:b:0", job_key="ns:{k}", fence=2)
    late = Effect(effect_id="lw1:c:0", job_key="ns:{k}", fence=1)  # below fence 2: stale
    answers = [inbox.accept(e) for e in (old, old, new, late)]
    assert answers == ["new", "duplicate", "new", "stale"]
    pod(EffectEvent(name="backlog", depth=3, oldest_age=1.5))
    counted = {
        point.attributes["leaseworker.effect.status"]: point.value
        for point in _points(metric_reader, "leaseworker.effects.received")
    }
    assert counted == {"new": 2, "duplicate": 1, "stale": 1}
    assert [p.value for p in _points(metric_reader, "leaseworker.outbox.depth")] == [3]
    assert [p.value for p in _points(metric_reader, "leaseworker.outbox.oldest_age")] == [1.5]


async def test_a_sampled_out_trigger_passes_its_decision_on_and_makes_no_effect_spans() -> None:
    """ALWAYS_OFF: the message carries the process span's context (not sampled); no spans."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    pod = Telemetry(tracer_provider=provider).instrument(pod="pod-a", group="g")
    record, _ = hooks._trigger(3)
    carrier: list[tuple[str, bytes]] = []
    with hooks._processing(pod, record):
        pod(EffectEvent(name="published", topic="reports.ready", carrier=carrier))
    carried = _remote(carrier)
    assert carried.is_valid
    assert not carried.trace_flags.sampled
    pod(EffectEvent(name="sent", topic="reports.ready", trace=tuple(carrier), began=0.0))
    assert exporter.get_finished_spans() == ()


def test_without_a_tracing_hook_a_message_carries_the_triggers_trace_context() -> None:
    """No pod telemetry (the testing kit's runs): the trigger's ``traceparent`` goes on."""
    parent = [("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01")]
    job = on_topic(Publishing, "reports.requested")("reports.ready")
    result = JobEnvironment(job).run_sync(make_trigger({"n": 1}, key="k", headers=parent))
    [message] = result.messages
    assert message.message.trace == tuple(parent)
