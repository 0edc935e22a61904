"""OTLP over HTTPS: spans reach a TLS collector (Jaeger) verified against the test CA.

A collector whose certificate does not verify, or that answers 401/403 to
the pod's credentials (``OTEL_EXPORTER_OTLP_HEADERS``), makes ``run`` exit 2
at start with one line that shows no header value: the SDK exporter would
only log the refusal once per batch, forever.
"""

from __future__ import annotations

import http.server
import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from leaseworker_dev._services import LocalJaeger

from ..waiting import eventually
from .collector import https_collector
from .secured_kafka import SecuredKafka
from .test_kafka_sasl_ssl import _cli, _refused_line

TOKEN = "Bearer otlp-secret-token-0123456789"

CA_BUNDLE_VARIABLES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
"""requests lets these override the exporter's OTEL_EXPORTER_OTLP_CERTIFICATE: unset here."""


@pytest.fixture(scope="module")
def tls_jaeger(
    secured_kafka: SecuredKafka, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalJaeger]:
    """A Jaeger whose OTLP/HTTP receiver serves HTTPS with a certificate of the test CA."""
    leaf = secured_kafka.ca.server(name="jaeger")
    jaeger = LocalJaeger.start(
        workdir=tmp_path_factory.mktemp("jaeger"), otlp_tls=(leaf.cert, leaf.key)
    )
    try:
        yield jaeger
    finally:
        jaeger.stop()


class _Refusing(http.server.BaseHTTPRequestHandler):
    """A collector that refuses every export with the status in ``status``."""

    status = 401

    def do_POST(self) -> None:
        """Answer with the refusal."""
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(self.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        """Keep the test output quiet."""


@pytest.fixture(params=[401, 403])
def refusing_collector(
    request: pytest.FixtureRequest, secured_kafka: SecuredKafka
) -> Iterator[str]:
    """Run an HTTPS collector answering 401 (or 403); yield its endpoint."""
    leaf = secured_kafka.ca.server(name="refusing")
    handler = type("Handler", (_Refusing,), {"status": request.param})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(leaf.cert, leaf.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"https://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


async def test_a_trigger_span_reaches_jaeger_over_https_through_sasl_ssl_kafka(
    secured_kafka: SecuredKafka, tls_jaeger: LocalJaeger
) -> None:
    """``trigger`` over SASL_SSL exports its span to the HTTPS receiver (CA: the test CA)."""
    names = secured_kafka.names("pod")
    env = secured_kafka.env(user="admin") | {
        "OTEL_EXPORTER_OTLP_CERTIFICATE": str(secured_kafka.ca.ca_file),
        "OTEL_SERVICE_NAME": "tls-producer",
        "OTEL_METRICS_EXPORTER": "none",
    }
    assert tls_jaeger.otlp_http_endpoint.startswith("https://")
    argv = ["trigger", names.topic, "--payload", "{}", "--otlp-endpoint"]
    await _traced_trigger([*argv, tls_jaeger.otlp_http_endpoint], env, tls_jaeger, "tls-producer")


def test_a_collector_with_an_unknown_ca_makes_run_exit_2_ssl(
    secured_kafka: SecuredKafka, tls_jaeger: LocalJaeger
) -> None:
    """The exporter verifies the collector against OTEL_EXPORTER_OTLP_CERTIFICATE."""
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": tls_jaeger.otlp_http_endpoint,
        "OTEL_EXPORTER_OTLP_CERTIFICATE": str(secured_kafka.other_ca.ca_file),
    }
    result, took = _cli(["run", "tests.jobs:MarkerJob"], env, drop=CA_BUNDLE_VARIABLES)
    line = _refused_line(result, took, TOKEN)
    assert "OTLP collector" in line
    assert "certificate is not accepted" in line


@pytest.mark.parametrize("certificate", ["expired", "another host's"])
def test_a_collector_with_an_expired_or_misnamed_certificate_makes_run_exit_2_ssl(
    secured_kafka: SecuredKafka, certificate: str
) -> None:
    """The collector's certificate chains to the trusted CA but expired, or names another host."""
    ca = secured_kafka.ca
    identity = (
        ca.server(expired=True, name="expired-collector")
        if certificate == "expired"
        else ca.server(hosts=("collector.invalid",), name="misnamed-collector")
    )
    with https_collector(identity) as collector:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
            "OTEL_EXPORTER_OTLP_CERTIFICATE": str(ca.ca_file),
        }
        result, took = _cli(["run", "tests.jobs:MarkerJob"], env, drop=CA_BUNDLE_VARIABLES)
        assert collector.exports == []
    line = _refused_line(result, took, TOKEN)
    assert "OTLP collector" in line
    assert "certificate is not accepted" in line
    assert ("expired" if certificate == "expired" else "mismatch") in line.lower()


def test_a_collector_answering_401_or_403_makes_run_exit_2_ssl(
    secured_kafka: SecuredKafka, refusing_collector: str, tmp_path: Path
) -> None:
    """A refusal of the pod's credentials: one line, exit 2, the header value not shown."""
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": refusing_collector,
        "OTEL_EXPORTER_OTLP_CERTIFICATE": str(secured_kafka.ca.ca_file),
        "OTEL_EXPORTER_OTLP_HEADERS": f"authorization={TOKEN.replace(' ', '%20')}",
    }
    result, took = _cli(["run", "tests.jobs:MarkerJob"], env, drop=CA_BUNDLE_VARIABLES)
    line = _refused_line(result, took, "otlp-secret-token")
    assert "OTLP collector" in line
    assert "refused the pod's spans (HTTP 40" in line


async def test_spans_reach_a_collector_asking_for_client_certificates_ssl(
    secured_kafka: SecuredKafka, tmp_path: Path
) -> None:
    """Mutual TLS to the collector: without a client certificate ``run`` exits 2.

    With OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE/_KEY the start-up check passes
    and the trigger's span is sent.
    """
    leaf = secured_kafka.ca.server(name="mtls-jaeger")
    jaeger = LocalJaeger.start(
        workdir=tmp_path / "jaeger",
        otlp_tls=(leaf.cert, leaf.key),
        otlp_client_ca=secured_kafka.ca.ca_file,
    )
    try:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_http_endpoint,
            "OTEL_EXPORTER_OTLP_CERTIFICATE": str(secured_kafka.ca.ca_file),
        }
        result, took = _cli(["run", "tests.jobs:MarkerJob"], env, drop=CA_BUNDLE_VARIABLES)
        line = _refused_line(result, took, TOKEN)
        assert "OTLP collector" in line
        assert "TLS" in line
        names = secured_kafka.names("pod")
        env |= secured_kafka.env(user="admin") | {
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": str(secured_kafka.client.cert),
            "OTEL_EXPORTER_OTLP_CLIENT_KEY": str(secured_kafka.client.key),
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_SERVICE_NAME": "mtls-producer",
        }
        argv = ["trigger", names.topic, "--payload", "{}"]
        await _traced_trigger(argv, env, jaeger, "mtls-producer")
    finally:
        jaeger.stop()


async def _traced_trigger(
    argv: list[str], env: dict[str, str], jaeger: LocalJaeger, service: str
) -> None:
    """Run ``leaseworker trigger`` (exit 0) and wait until its trace is in ``jaeger``."""
    sent, _ = _cli(argv, env, drop=CA_BUNDLE_VARIABLES)
    assert sent.returncode == 0, sent.stderr
    trace_id = json.loads(sent.stdout)["traceId"]

    async def arrived() -> bool:
        spans = await anyio.to_thread.run_sync(jaeger.find_traces, service)
        return any(span.trace_id == trace_id for span in spans)

    await eventually(arrived, within=30)
