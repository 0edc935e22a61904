"""End to end: a ``leaseworker run`` pod exports OTLP to a real Jaeger; the trace is queryable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from leaseworker._timeline import JaegerSpan
from leaseworker_dev._demos import pod_environment
from leaseworker_dev._services import LocalJaeger, LocalKafka, LocalRedis

from ..kafka_util import KafkaNames
from ..pods import REPO, spawn_pod
from ..waiting import eventually

LEASEWORKER = str(Path(sys.executable).parent / "leaseworker")


@pytest.fixture
def jaeger(tmp_path: Path) -> Iterator[LocalJaeger]:
    """A private Jaeger (cached build) for this test."""
    instance = LocalJaeger.start(workdir=tmp_path / "jaeger")
    try:
        yield instance
    finally:
        instance.stop()


def _trigger(kafka: LocalKafka, jaeger: LocalJaeger, topic: str, key: str) -> dict[str, object]:
    """Run ``leaseworker trigger`` exporting its send span; return what it printed."""
    env = {**os.environ, "OTEL_SERVICE_NAME": "e2e-producer", "OTEL_METRICS_EXPORTER": "none"}
    result = subprocess.run(
        [
            LEASEWORKER,
            "trigger",
            topic,
            "--key",
            key,
            "--payload",
            json.dumps({"seconds": 0.2}),
            "--bootstrap-servers",
            kafka.bootstrap_servers,
            "--otlp-endpoint",
            jaeger.otlp_http_endpoint,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    printed: dict[str, object] = json.loads(result.stdout)
    return printed


async def test_run_pod_exports_the_lifecycle_trace_with_the_offset_to_jaeger(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    jaeger: LocalJaeger,
    tmp_path: Path,
) -> None:
    """Trigger -> pod -> Jaeger: one trace from ``send`` through ``process`` to ``commit``.

    The ``process {topic}`` span is the child of the producer's ``send`` span,
    carries the Kafka offset as an integer, and has the lifecycle children; the
    pod's JSON log lines carry the same trace id. SIGTERM flushes and exits 0.
    """
    topic, key, service = kafka_names.topic, "report:e2e:1", "e2e-worker"
    kafka_server.create_topics([topic])
    env = {
        **pod_environment(jaeger, service),
        "LEASEWORKER_BOOTSTRAP_SERVERS": kafka_server.bootstrap_servers,
        "LEASEWORKER_REDIS_URL": redis_server.url,
        "LEASEWORKER_GROUP": kafka_names.group,
        "LEASEWORKER_NAMESPACE": namespace,
        "LW_TEST_TOPIC": topic,
        "LW_TEST_LEASE": "3",
    }
    pod = spawn_pod("pod-e2e", tmp_path, env, "--log-format", "json")
    try:
        printed = _trigger(kafka_server, jaeger, topic, key)
        offset, trace_id = printed["offset"], printed["traceId"]
        spans: list[JaegerSpan] = []

        async def committed() -> bool:
            nonlocal spans
            found = await anyio.to_thread.run_sync(jaeger.find_traces, service)
            spans = [s for s in found if s.trace_id == trace_id]
            return any(s.name == f"commit {topic}" for s in spans)

        await eventually(committed, within=60)
        pod.signal(signal.SIGTERM)
        assert await pod.wait_exit(within=30) == 0
    finally:
        pod.kill()
    by_name = {s.name: s for s in spans}
    send, process = by_name[f"send {topic}"], by_name[f"process {topic}"]
    assert send.service == "e2e-producer"
    assert process.service == service
    assert process.parent_span_id == send.span_id
    assert process.attributes["messaging.kafka.offset"] == offset
    assert process.attributes["messaging.destination.partition.id"] == "0"
    assert process.attributes["messaging.consumer.group.name"] == kafka_names.group
    assert process.attributes["leaseworker.job.key"] == key
    assert process.attributes["leaseworker.outcome"] == "completed"
    for name in ("trigger received", "lease acquire", "job run", "lease release"):
        assert by_name[name].parent_span_id == process.span_id, name
        assert by_name[name].attributes["messaging.kafka.offset"] == offset, name
    logged = [json.loads(line) for line in pod.log_text().splitlines() if line.startswith("{")]
    finished = [r for r in logged if r.get("event") == "finished" and r.get("jobId") == key]
    assert [r["traceId"] for r in finished] == [trace_id]
    assert finished[0]["outcome"] == "completed"
