"""Telemetry in-process: the span tree of real executions (real Kafka, real Redis).

Spans go to the SDK's in-memory exporter through an injected tracer provider,
metrics to an in-memory reader; the worker, its Kafka consumer group and its
Redis leases are real. Each test drives one trigger to its committed end and
then reads the trace.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import SpanKind, StatusCode
from redis.asyncio import Redis

from leaseworker import CompletionRequest, Event, ExecutionEvent, Pod, RedisLeases, open_store
from leaseworker._execution import LoggingObserver, completion_key
from leaseworker._telemetry import Telemetry, traced_send
from leaseworker._telemetry._lean import LeanTracerProvider
from leaseworker_dev._services import LocalKafka, LocalRedis

from ..jobs import GateJob, Recorder, on_topic
from ..kafka_util import KafkaNames, payload
from ..worker_util import pod_config, running, until

SECRET = "s3cr3t-payload-value"


@pytest.fixture(autouse=True)
def topic(kafka_server: LocalKafka, kafka_names: KafkaNames) -> str:
    """A fresh one-partition trigger topic for each test."""
    kafka_server.create_topics([kafka_names.topic])
    return kafka_names.topic


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    """Where the worker's spans land."""
    return InMemorySpanExporter()


@pytest.fixture
def metric_reader() -> InMemoryMetricReader:
    """Where the worker's metrics land."""
    return InMemoryMetricReader()


@pytest.fixture(params=["sdk", "lean"])
def providers(
    request: pytest.FixtureRequest,
    exporter: InMemorySpanExporter,
    metric_reader: InMemoryMetricReader,
) -> Iterator[tuple[TracerProvider | LeanTracerProvider, MeterProvider]]:
    """Injected providers (never the global ones), shut down after the test.

    Each test runs with the SDK's tracer provider (what embedding applications
    inject) and with the lean one ``leaseworker run`` builds.
    """
    tracer_provider, meter_provider = _providers(request.param, exporter, metric_reader)
    yield tracer_provider, meter_provider
    tracer_provider.shutdown()
    meter_provider.shutdown()


def _providers(
    kind: str,
    exporter: InMemorySpanExporter,
    metric_reader: InMemoryMetricReader,
    sampler: Sampler | None = None,
) -> tuple[TracerProvider | LeanTracerProvider, MeterProvider]:
    """The SDK's tracer provider (``sdk``) or the lean one (``lean``), and a meter provider."""
    resource = Resource.create({"service.name": "test-worker", "service.instance.id": "pod-a"})
    tracer_provider: TracerProvider | LeanTracerProvider = TracerProvider(
        resource=resource, sampler=sampler
    )
    if kind == "lean":
        tracer_provider = LeanTracerProvider(resource, tracer_provider.sampler)
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    return tracer_provider, MeterProvider(metric_readers=[metric_reader], resource=resource)


@pytest.fixture
def telemetry(providers: tuple[TracerProvider | LeanTracerProvider, MeterProvider]) -> Telemetry:
    """Telemetry on the injected providers."""
    return Telemetry(tracer_provider=providers[0], meter_provider=providers[1])


@pytest.fixture
def producer_spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """The producing application's own tracer provider and exporter."""
    spans = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "test-producer"}))
    provider.add_span_processor(SimpleSpanProcessor(spans))
    yield provider, spans
    provider.shutdown()


async def send(
    bootstrap: str, topic: str, key: str, value: bytes, headers: Sequence[tuple[str, bytes]] = ()
) -> int:
    """Produce one record with ``headers``; return its offset (test topics have one partition)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    with anyio.fail_after(30):
        await producer.start()
        try:
            meta = await producer.send_and_wait(
                topic, value=value, key=key.encode(), headers=list(headers) or None
            )
        finally:
            await producer.stop()
    return int(meta.offset)


def trace_of(exporter: InMemorySpanExporter, topic: str, offset: int) -> list[ReadableSpan]:
    """Return every span of the trace whose process span handled ``topic``@``offset``."""
    spans = list(exporter.get_finished_spans())
    roots = [
        s
        for s in spans
        if s.name == f"process {topic}" and _attrs(s).get("messaging.kafka.offset") == offset
    ]
    if not roots:
        return []
    trace_id = _ctx(roots[0]).trace_id
    return [s for s in spans if _ctx(s).trace_id == trace_id]


def committed_trace(exporter: InMemorySpanExporter, topic: str, offset: int) -> bool:
    """Whether the trace of ``offset`` already has its ``commit`` span."""
    return any(s.name == f"commit {topic}" for s in trace_of(exporter, topic, offset))


def named(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    """Spans called ``name``, in start order."""
    return sorted((s for s in spans if s.name == name), key=lambda s: s.start_time or 0)


def _ctx(span: ReadableSpan) -> Any:
    context = span.context
    assert context is not None
    return context


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _assert_common(span: ReadableSpan, *, topic: str, offset: int, group: str, key: str) -> None:
    """The Kafka coordinates and leaseworker identity every span carries."""
    attrs = _attrs(span)
    assert attrs["messaging.system"] == "kafka", span.name
    assert attrs["messaging.destination.name"] == topic, span.name
    assert attrs["messaging.destination.partition.id"] == "0", span.name
    assert attrs["messaging.kafka.offset"] == offset, span.name
    assert isinstance(attrs["messaging.kafka.offset"], int), span.name
    assert attrs["messaging.kafka.message.key"] == key, span.name
    assert attrs["messaging.consumer.group.name"] == group, span.name
    assert attrs["leaseworker.job.key"] == key, span.name
    assert attrs["leaseworker.pod"] == "pod-a", span.name
    assert attrs["leaseworker.execution.id"], span.name
    assert "messaging.operation.name" in attrs, span.name


def _assert_no_payload(spans: list[ReadableSpan]) -> None:
    for span in spans:
        for value in _attrs(span).values():
            assert SECRET not in str(value), span.name
        for event in span.events:
            assert SECRET not in str(dict(event.attributes or {})), span.name


def _points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    assert data is not None
    return [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


async def test_completed_execution_is_one_trace_under_the_producer_span(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    exporter: InMemorySpanExporter,
    telemetry: Telemetry,
    producer_spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """A completed trigger: CONSUMER ``process`` span parented on and linked to the producer.

    Its children are the lifecycle steps (received, acquire, run, release,
    commit), each with the messaging coordinates (offset as an int) and
    leaseworker's identity; the payload appears nowhere.
    """
    topic, key = kafka_names.topic, "report:acme:2026-11"
    producer_provider, producer_exporter = producer_spans
    with traced_send(topic, key, producer_provider) as outgoing:
        offset = await send(
            kafka_server.bootstrap_servers,
            topic,
            key,
            payload(secret=SECRET),
            outgoing.headers,
        )
    [send_span] = producer_exporter.get_finished_spans()
    job = on_topic(GateJob, topic)(Recorder())
    config = pod_config(kafka_server, redis_server, kafka_names, namespace)
    async with running(Pod(job, config, telemetry=telemetry)):
        await until(lambda: committed_trace(exporter, topic, offset))
    spans = trace_of(exporter, topic, offset)
    [process] = named(spans, f"process {topic}")
    assert process.kind == SpanKind.CONSUMER
    assert _ctx(process).trace_id == _ctx(send_span).trace_id
    assert process.parent is not None
    assert process.parent.span_id == _ctx(send_span).span_id
    assert [link.context.span_id for link in process.links] == [_ctx(send_span).span_id]
    assert _attrs(process)["messaging.operation.name"] == "process"
    assert _attrs(process)["messaging.operation.type"] == "process"
    assert _attrs(process)["leaseworker.outcome"] == "completed"
    children = [
        s for s in spans if s.parent is not None and s.parent.span_id == _ctx(process).span_id
    ]
    assert sorted({s.name for s in children}) == sorted(
        {
            "trigger received",
            "lease acquire",
            "job run",
            "completion",
            "lease release",
            f"commit {topic}",
        }
        | ({"lease renew"} if named(spans, "lease renew") else set())
    )
    for span in [process, *children]:
        _assert_common(span, topic=topic, offset=offset, group=kafka_names.group, key=key)
    [acquire] = named(spans, "lease acquire")
    [run] = named(spans, "job run")
    [release] = named(spans, "lease release")
    [completion] = named(spans, "completion")
    assert _attrs(completion)["leaseworker.completion.status"] == "accepted"
    assert _attrs(completion)["leaseworker.fence"] == _attrs(acquire)["leaseworker.fence"]
    assert _attrs(acquire)["leaseworker.outcome"] == "acquired"
    assert _attrs(acquire)["leaseworker.lease.busy_retries"] == 0
    assert _attrs(run)["leaseworker.fence"] == _attrs(acquire)["leaseworker.fence"]
    assert _attrs(run)["leaseworker.outcome"] == "completed"
    assert _attrs(release)["leaseworker.release.deleted"] is True
    [commit] = named(spans, f"commit {topic}")
    assert commit.kind == SpanKind.CLIENT
    assert _attrs(commit)["messaging.operation.name"] == "commit"
    assert _attrs(commit)["messaging.operation.type"] == "settle"
    assert _attrs(commit)["leaseworker.commit.position"] == offset + 1
    _assert_no_payload(spans)


async def test_lost_lease_shows_loss_cancel_and_stop_with_its_latency(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    redis: Redis,
    exporter: InMemorySpanExporter,
    metric_reader: InMemoryMetricReader,
    telemetry: Telemetry,
) -> None:
    """Deleting the lease mid-run: rejected renewal -> lost -> cancel requested -> stopped.

    The stop span carries the stop latency, the first execution ends ``lost``
    and the retry completes in the same trace; metrics count the loss by
    reason and the stop latency, with no job key in any metric label.
    """
    topic, key = kafka_names.topic, "report:lost:1"
    recorder = Recorder()
    job = on_topic(GateJob, topic, lease_duration=1.5)(recorder)
    config = pod_config(kafka_server, redis_server, kafka_names, namespace)
    async with running(Pod(job, config, telemetry=telemetry)):
        offset = await send(kafka_server.bootstrap_servers, topic, key, payload(gate=True))
        await recorder.until(lambda: len(recorder.runs_of(key)) == 1)
        lease_key = RedisLeases(redis, namespace=namespace).lease_key(key)
        assert await redis.delete(lease_key) == 1
        await recorder.until(lambda: recorder.done(key, "lost") == 1)
        recorder.gate(key).set()
        await until(lambda: committed_trace(exporter, topic, offset))
    spans = trace_of(exporter, topic, offset)
    [process] = named(spans, f"process {topic}")
    assert _attrs(process)["leaseworker.outcome"] == "completed"
    assert all(
        s.parent is not None and s.parent.span_id == _ctx(process).span_id
        for s in spans
        if s is not process
    )
    runs = named(spans, "job run")
    assert [_attrs(r)["leaseworker.outcome"] for r in runs] == ["lost", "completed"]
    assert runs[0].status.status_code == StatusCode.ERROR
    lost_execution = _attrs(runs[0])["leaseworker.execution.id"]
    assert lost_execution != _attrs(runs[1])["leaseworker.execution.id"]
    rejected = [s for s in named(spans, "lease renew") if s.status.status_code == StatusCode.ERROR]
    assert [_attrs(s)["leaseworker.renewal.outcome"] for s in rejected] == ["rejected"]
    [lost] = named(spans, "ownership lost")
    [cancel] = named(spans, "cancel requested")
    [stopped] = named(spans, "job stopped")
    assert _attrs(lost)["leaseworker.loss.reason"] == "rejected"
    for span in (lost, cancel, stopped):
        assert _attrs(span)["leaseworker.execution.id"] == lost_execution
    assert (lost.start_time or 0) <= (cancel.start_time or 0) <= (stopped.end_time or 0)
    latency = _attrs(stopped)["leaseworker.stop_latency_ms"]
    assert latency >= 0
    assert (stopped.end_time or 0) - (stopped.start_time or 0) == pytest.approx(
        latency * 1e6, abs=2e6
    )
    releases = named(spans, "lease release")
    assert [_attrs(r)["leaseworker.release.deleted"] for r in releases] == [False, True]
    first, takeover = named(spans, "lease acquire")
    assert "leaseworker.previous.execution.id" not in _attrs(first)
    assert not first.links
    # The takeover links to the execution it succeeded: the trace and span it left in Redis.
    assert _attrs(takeover)["leaseworker.previous.execution.id"] == lost_execution
    [link] = takeover.links
    assert (link.context.trace_id, link.context.span_id) == (
        _ctx(process).trace_id,
        _ctx(process).span_id,
    )
    assert dict(link.attributes or {}) == {"leaseworker.execution.id": lost_execution}
    # The failed renewal covers its round trip: it was sent before the loss was declared.
    [failed] = rejected
    assert (failed.start_time or 0) < (failed.end_time or 0)
    assert (failed.end_time or 0) == pytest.approx(lost.start_time or 0, abs=1e6)  # the verdict
    losses = _points(metric_reader, "leaseworker.lease.losses")
    assert [(dict(p.attributes), p.value) for p in losses] == [
        ({"leaseworker.loss.reason": "rejected"}, 1)
    ]
    [stop_latency] = _points(metric_reader, "leaseworker.lease.stop_latency")
    assert stop_latency.count == 1
    outcomes = {
        p.attributes["leaseworker.outcome"]: p.value
        for p in _points(metric_reader, "leaseworker.execution.outcomes")
    }
    assert outcomes == {"lost": 1, "completed": 1}
    [in_flight] = _points(metric_reader, "leaseworker.execution.in_flight")
    assert in_flight.value == 0
    data = metric_reader.get_metrics_data()
    assert data is not None
    exported = data.to_json()
    assert key not in exported
    assert lost_execution not in exported


class _BusySeen:
    """An execution observer that logs as usual and flags the first ``busy`` outcome."""

    def __init__(self) -> None:
        self.busy = anyio.Event()
        self._log = LoggingObserver()

    def __call__(self, event: Event) -> None:
        if not isinstance(event, ExecutionEvent) or event.event == "acquiring":
            return
        self._log.on_event(event)
        if event.outcome == "busy":
            self.busy.set()


async def test_busy_wait_is_one_acquire_span_with_its_retries(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    leases: RedisLeases,
    exporter: InMemorySpanExporter,
    telemetry: Telemetry,
) -> None:
    """While another owner holds the lease, the wait is one ``lease acquire`` span.

    It records each busy attempt as an event and their count, and ends
    ``acquired`` once the holder released; one job run follows.
    """
    topic, key = kafka_names.topic, "report:busy:1"
    holder = await leases.acquire(key, 30)
    assert holder is not None
    seen = _BusySeen()
    job = on_topic(GateJob, topic)(Recorder())
    config = pod_config(kafka_server, redis_server, kafka_names, namespace)
    async with running(Pod(job, config, hooks=[seen], telemetry=telemetry)):
        offset = await send(kafka_server.bootstrap_servers, topic, key, payload())
        with anyio.fail_after(20):
            await seen.busy.wait()
        assert await leases.release(holder)
        await until(lambda: committed_trace(exporter, topic, offset))
    spans = trace_of(exporter, topic, offset)
    [acquire] = named(spans, "lease acquire")
    retries = _attrs(acquire)["leaseworker.lease.busy_retries"]
    assert retries >= 1
    assert [e.name for e in acquire.events if e.name == "busy"] == ["busy"] * retries
    assert _attrs(acquire)["leaseworker.outcome"] == "acquired"
    assert _attrs(acquire)["leaseworker.lease.wait_ms"] > 0
    [run] = named(spans, "job run")
    assert _attrs(run)["leaseworker.outcome"] == "completed"
    assert _attrs(run)["leaseworker.execution.id"] == _attrs(acquire)["leaseworker.execution.id"]


async def test_duplicate_is_answered_from_the_store_without_lease_or_run_spans(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    exporter: InMemorySpanExporter,
    metric_reader: InMemoryMetricReader,
    telemetry: Telemetry,
) -> None:
    """A redelivered trigger is one ``process`` trace ending ``duplicate``: no lease, no run.

    The first delivery's ``completion`` span says ``accepted`` and the
    completions counter records one accepted and no stale answer.
    """
    topic, key = kafka_names.topic, "report:dup:1"
    recorder = Recorder()
    job = on_topic(GateJob, topic)(recorder)
    config = pod_config(kafka_server, redis_server, kafka_names, namespace)
    async with running(Pod(job, config, telemetry=telemetry)):
        first = await send(kafka_server.bootstrap_servers, topic, key, payload(n=1))
        await until(lambda: committed_trace(exporter, topic, first))
        again = await send(kafka_server.bootstrap_servers, topic, key, payload(n=1))
        await until(lambda: committed_trace(exporter, topic, again))
    assert len(recorder.runs) == 1
    [completion] = named(trace_of(exporter, topic, first), "completion")
    assert _attrs(completion)["leaseworker.completion.status"] == "accepted"
    spans = trace_of(exporter, topic, again)
    [process] = named(spans, f"process {topic}")
    assert _attrs(process)["leaseworker.outcome"] == "duplicate"
    names = {s.name for s in spans}
    assert "lease acquire" not in names
    assert "job run" not in names
    assert f"commit {topic}" in names
    for span in spans:
        _assert_common(span, topic=topic, offset=again, group=kafka_names.group, key=key)
    answers = {
        dict(p.attributes)["leaseworker.completion.status"]: p.value
        for p in _points(metric_reader, "leaseworker.completions")
    }
    assert answers == {"accepted": 1}


async def test_a_stale_completion_ends_the_trigger_with_its_commit_span_and_count(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    exporter: InMemorySpanExporter,
    metric_reader: InMemoryMetricReader,
    telemetry: Telemetry,
    tmp_path: Path,
) -> None:
    """``lost`` with reason ``stale`` is final: the trace gets its commit span, the count moves.

    A newer fence already completed the job key, so this execution's result is
    refused. The worker commits the offset (the newer completion is durable);
    telemetry used to treat the trigger as unfinished: no ``commit`` span, and
    the committed counter fell behind the received one for good.
    """
    topic, key = kafka_names.topic, "report:stale:1"
    store_url = f"sqlite:///{tmp_path / 'completions.sqlite3'}"
    async with open_store(store_url) as store:  # another pod, with a far newer fence
        await store.complete(
            CompletionRequest(
                job_key=completion_key(namespace, key),
                input_version="newer-inputs",
                fence=2**62,
                result={"total": 2},
                execution_id="e-other",
                pod="pod-b",
            )
        )
    job = on_topic(GateJob, topic)(Recorder())
    config = pod_config(kafka_server, redis_server, kafka_names, namespace, store_url=store_url)
    async with running(Pod(job, config, telemetry=telemetry)):
        offset = await send(kafka_server.bootstrap_servers, topic, key, payload(n=1))
        await until(lambda: committed_trace(exporter, topic, offset))
    [process] = named(trace_of(exporter, topic, offset), f"process {topic}")
    assert _attrs(process)["leaseworker.outcome"] == "lost"
    [received] = [p.value for p in _points(metric_reader, "leaseworker.triggers.received")]
    [committed] = [p.value for p in _points(metric_reader, "leaseworker.triggers.committed")]
    assert received == committed == 1


async def test_malformed_trigger_is_an_error_span_and_still_committed(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    exporter: InMemorySpanExporter,
    telemetry: Telemetry,
) -> None:
    """A record that is not JSON: the process span says why (no payload), then it commits."""
    topic = kafka_names.topic
    job = on_topic(GateJob, topic)(Recorder())
    config = pod_config(kafka_server, redis_server, kafka_names, namespace)
    async with running(Pod(job, config, telemetry=telemetry)):
        offset = await send(kafka_server.bootstrap_servers, topic, "k", SECRET.encode())
        await until(lambda: committed_trace(exporter, topic, offset))
    spans = trace_of(exporter, topic, offset)
    [process] = named(spans, f"process {topic}")
    assert process.status.status_code == StatusCode.ERROR
    assert _attrs(process)["leaseworker.malformed.reason"] == "not_json"
    assert _attrs(process)["leaseworker.outcome"] == "malformed"
    assert process.parent is None  # no traceparent: the trigger starts its own trace
    _assert_no_payload(spans)


async def test_without_parenting_the_trigger_starts_a_trace_linked_to_the_producer(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    exporter: InMemorySpanExporter,
    providers: tuple[TracerProvider | LeanTracerProvider, MeterProvider],
    producer_spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """``parent_on_producer=False``: a new root span whose only link is the producer's span."""
    topic, key = kafka_names.topic, "report:linked:1"
    telemetry = Telemetry(tracer_provider=providers[0], parent_on_producer=False)
    with traced_send(topic, key, producer_spans[0]) as outgoing:
        offset = await send(kafka_server.bootstrap_servers, topic, key, payload(), outgoing.headers)
    [send_span] = producer_spans[1].get_finished_spans()
    job = on_topic(GateJob, topic)(Recorder())
    config = pod_config(kafka_server, redis_server, kafka_names, namespace)
    async with running(Pod(job, config, telemetry=telemetry)):
        await until(lambda: committed_trace(exporter, topic, offset))
    [process] = named(trace_of(exporter, topic, offset), f"process {topic}")
    assert process.parent is None
    assert _ctx(process).trace_id != _ctx(send_span).trace_id
    assert [link.context.span_id for link in process.links] == [_ctx(send_span).span_id]


class _DropsProcessSpans(Sampler):
    """Drops every ``process`` span and samples everything else, orphans included."""

    def should_sample(
        self,
        parent_context: Any,
        trace_id: int,
        name: str,
        kind: Any = None,
        attributes: Any = None,
        links: Any = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        decision = Decision.DROP if name.startswith("process ") else Decision.RECORD_AND_SAMPLE
        return SamplingResult(decision)

    def get_description(self) -> str:
        return "DropsProcessSpans"


@pytest.mark.parametrize("kind", ["sdk", "lean"])
async def test_a_sampled_out_trigger_makes_no_lifecycle_spans_but_keeps_its_metrics(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    exporter: InMemorySpanExporter,
    metric_reader: InMemoryMetricReader,
    kind: str,
) -> None:
    """A trigger's trace is sampled as a whole, by its ``process`` span.

    The sampler here would keep the children of a dropped process span
    (orphans): the worker does not make them, so a sampled-out trigger costs
    no spans. Its metrics are counted all the same.
    """
    topic = kafka_names.topic
    tracer_provider, meter_provider = _providers(
        kind, exporter, metric_reader, _DropsProcessSpans()
    )
    telemetry = Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider)

    def committed() -> int:
        if metric_reader.get_metrics_data() is None:  # nothing measured yet
            return 0
        return sum(p.value for p in _points(metric_reader, "leaseworker.triggers.committed"))

    job = on_topic(GateJob, topic)(Recorder())
    config = pod_config(kafka_server, redis_server, kafka_names, namespace)
    try:
        async with running(Pod(job, config, telemetry=telemetry)):
            await send(kafka_server.bootstrap_servers, topic, "report:sampled-out", payload())
            await until(lambda: committed() == 1)
        outcomes = _points(metric_reader, "leaseworker.execution.outcomes")
        assert [(p.attributes["leaseworker.outcome"], p.value) for p in outcomes] == [
            ("completed", 1)
        ]
        completions = _points(metric_reader, "leaseworker.completions")
        assert [(p.attributes["leaseworker.completion.status"], p.value) for p in completions] == [
            ("accepted", 1)
        ]
        assert list(exporter.get_finished_spans()) == []
    finally:
        tracer_provider.shutdown()
        meter_provider.shutdown()
