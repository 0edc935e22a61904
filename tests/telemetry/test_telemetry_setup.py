"""Telemetry setup and JSON logs: OTEL_* configuration, Prometheus endpoint, import isolation."""

from __future__ import annotations

import contextlib
import http.server
import io
import json
import logging
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from opentelemetry.sdk.trace import TracerProvider

from leaseworker._telemetry import JsonFormatter, configure
from leaseworker._telemetry._setup import SWITCH_INTERVAL
from leaseworker_dev._services import free_port


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


@pytest.mark.parametrize(("before", "after"), [(0.005, 0.001), (0.0005, 0.0005)])
def test_exporting_spans_shortens_the_gil_switch_interval_never_lengthens_it(
    monkeypatch: pytest.MonkeyPatch, before: float, after: float
) -> None:
    """The export thread keeps the GIL from the event loop for at most SWITCH_INTERVAL."""
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    interval = sys.getswitchinterval()
    sys.setswitchinterval(before)
    try:
        configured = configure(pod="pod-a", otlp_endpoint="http://127.0.0.1:9")
        configured.close(timeout=0.5)
        assert sys.getswitchinterval() == pytest.approx(after)
        assert SWITCH_INTERVAL == 0.001
    finally:
        sys.setswitchinterval(interval)


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
        "import leaseworker, leaseworker._worker._worker, leaseworker._cli._run_command\n"
        "from leaseworker._telemetry import Telemetry\n"
        "Telemetry().instrument(pod='p', group='g')\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.stdout.strip() == "ok", result.stderr


class _Collector(http.server.BaseHTTPRequestHandler):
    """A minimal OTLP/HTTP receiver: keeps each request's path, headers and body."""

    received: ClassVar[list[tuple[str, dict[str, str], bytes]]] = []

    def do_POST(self) -> None:
        """Record the request and answer 200 with an empty OTLP response."""
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: Any) -> None:
        """Keep the test output quiet."""


@contextlib.contextmanager
def _collector() -> Iterator[int]:
    """Run a local OTLP/HTTP collector (:class:`_Collector`); yield its port."""
    _Collector.received = []
    server = http.server.HTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()


def _send_one_span(attributes: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Export one ``process t`` span through telemetry configured from the environment."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "5")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    configured = configure(pod="pod-a")
    configured.tracer_provider.get_tracer("test").start_span(
        "process t", attributes=attributes
    ).end()
    configured.close(timeout=5)


@pytest.mark.parametrize(
    ("protocol", "content_type"),
    [(None, "application/json"), ("http/protobuf", "application/x-protobuf")],
)
def test_spans_go_as_otlp_json_to_the_env_endpoint_with_the_env_headers(
    monkeypatch: pytest.MonkeyPatch, protocol: str | None, content_type: str
) -> None:
    """Spans are posted to ``{OTEL_EXPORTER_OTLP_ENDPOINT}/v1/traces`` with OTEL headers.

    OTLP/JSON by default; ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf``
    picks the SDK's protobuf exporter. A real local HTTP server receives them.
    """
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=acme")
    if protocol is None:
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", raising=False)
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
    else:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", protocol)
    with _collector() as port:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}/")
        _send_one_span({"messaging.kafka.offset": 7}, monkeypatch)
    [(path, headers, body)] = _Collector.received
    assert path == "/v1/traces"
    assert headers["content-type"] == content_type
    assert headers["x-tenant"] == "acme"
    if protocol is None:
        [span] = json.loads(body)["resourceSpans"][0]["scopeSpans"][0]["spans"]
        assert span["name"] == "process t"
        assert span["attributes"] == [{"key": "messaging.kafka.offset", "value": {"intValue": "7"}}]


def test_a_signal_endpoint_variable_wins_over_the_shared_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is used as it is, whatever the shared variable says.

    The OpenTelemetry spec gives the signal's own variable precedence; the
    shared one used to be turned into ``{shared}/v1/traces`` and win.
    """
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    with _collector() as port:
        traces = f"http://127.0.0.1:{port}/tenant/traces"
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", traces)
        _send_one_span({}, monkeypatch)
    [(path, _, _)] = _Collector.received
    assert path == "/tenant/traces"


_EXIT_SCRIPT = """
import os, socket, anyio
hole = socket.socket()
hole.bind(("127.0.0.1", 0))
hole.listen(16)  # the kernel accepts connections; nobody ever answers
os.environ["OTEL_EXPORTER_OTLP_TIMEOUT"] = "30"
os.environ["OTEL_METRICS_EXPORTER"] = "none"
from leaseworker._telemetry._setup import SWITCH_INTERVAL, configure
configured = configure(pod="pod-a", otlp_endpoint=f"http://127.0.0.1:{hole.getsockname()[1]}")
tracer = configured.tracer_provider.get_tracer("test")
for _ in range(10):
    tracer.start_span("process t").end()
anyio.run(configured.aclose, 1.0)
print("closed", flush=True)
"""


def test_pod_exit_waits_for_telemetry_at_most_its_flush_bound() -> None:
    """A collector that never answers: the process exits about when aclose gives up.

    The flush used to go on in a non-daemon worker thread after aclose gave
    up, and the interpreter waited for it (here the exporter's 30 s timeout)
    before exiting: the drain time of a pod's shutdown, wasted.
    """
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", _EXIT_SCRIPT], capture_output=True, text=True, timeout=90
    )
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert "closed" in result.stdout
    assert "telemetry did not flush within 1.0s" in result.stderr
    assert took < 15  # not the exporter's 30 s
