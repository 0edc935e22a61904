"""Telemetry setup and JSON logs: OTEL_* configuration, Prometheus endpoint, import isolation."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import urllib.request
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.trace import TracerProvider

from leaseworker._telemetry import JsonFormatter
from leaseworker._telemetry._setup import configure


def test_json_log_line_has_the_lifecycle_fields_and_the_current_trace_ids() -> None:
    """One JSON object per line: timestamp, the ``extra`` fields, traceId/spanId of the span."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("test.telemetry.json")
    logger.addHandler(handler)
    logger.propagate = False
    tracer = TracerProvider().get_tracer("test")
    try:
        with tracer.start_as_current_span("process t") as span:
            logger.warning(
                "finished",
                extra={
                    "jobId": "report:a",
                    "executionId": "e1",
                    "pod": "pod-a",
                    "event": "finished",
                    "elapsedMs": 12.5,
                    "renewalOutcome": "rejected",
                    "reason": "rejected",
                },
            )
    finally:
        logger.removeHandler(handler)
    [line] = stream.getvalue().splitlines()
    record = json.loads(line)
    context = span.get_span_context()
    assert record["traceId"] == f"{context.trace_id:032x}"
    assert record["spanId"] == f"{context.span_id:016x}"
    assert record["timestamp"].endswith("+00:00")
    for field, value in {
        "jobId": "report:a",
        "executionId": "e1",
        "pod": "pod-a",
        "event": "finished",
        "elapsedMs": 12.5,
        "renewalOutcome": "rejected",
        "reason": "rejected",
        "level": "WARNING",
        "message": "finished",
    }.items():
        assert record[field] == value, field


def test_without_an_endpoint_nothing_is_exported_and_nothing_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No OTLP endpoint, no metrics port: no SDK providers, and the no-op hooks work."""
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", raising=False)
    configured = configure(pod="pod-a")
    assert configured.tracer_provider is None
    assert configured.meter_provider is None
    assert configured.exporting == []
    pod = configured.telemetry.instrument(pod="pod-a", group="g")
    pod.dead_lettered(SimpleNamespace(topic="t"), "not_json")
    configured.close()


def test_endpoint_from_otel_env_turns_on_trace_export_unless_disabled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT enables traces; OTEL_SDK_DISABLED=true turns it all off."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "reports")
    configured = configure(pod="pod-a")
    try:
        assert configured.exporting == ["traces"]
        resource = configured.tracer_provider.resource.attributes
        assert resource["service.name"] == "reports"
        assert resource["service.instance.id"] == "pod-a"
    finally:
        configured.close(timeout=0.5)
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert configure(pod="pod-a").tracer_provider is None


def test_metrics_port_serves_prometheus_text_without_job_keys() -> None:
    """``--metrics-port``: a scrape endpoint with leaseworker's metrics, low-cardinality labels."""
    configured = configure(pod="pod-a", metrics_port=0, metrics_host="127.0.0.1")
    try:
        pod = configured.telemetry.instrument(pod="pod-a", group="g")
        pod.dead_lettered(SimpleNamespace(topic="reports"), "not_json")
        url = f"http://127.0.0.1:{configured.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    finally:
        configured.close()
    [line] = [x for x in text.splitlines() if x.startswith("leaseworker_dead_letters_total{")]
    assert 'leaseworker_dead_letter_reason="not_json"' in line
    assert 'messaging_destination_name="reports"' in line
    assert line.endswith(" 1.0")


def test_the_library_works_with_only_the_opentelemetry_api() -> None:
    """With the SDK, exporters and prometheus_client unimportable, leaseworker still imports.

    The library layers (lease, execution, Kafka source, worker, telemetry hooks)
    depend on opentelemetry-api only; the SDK is imported lazily by the CLI's
    setup. (redis-py probes for the SDK itself, inside ``try/except ImportError``.)
    """
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'prometheus_client' or name.startswith(\n"
        "                ('opentelemetry.sdk', 'opentelemetry.exporter')):\n"
        "            raise ImportError(f'blocked: {name}')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import leaseworker, leaseworker._worker, leaseworker._run_cmd\n"
        "from leaseworker._telemetry import Telemetry\n"
        "Telemetry().instrument(pod='p', group='g')\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.stdout.strip() == "ok", result.stderr
