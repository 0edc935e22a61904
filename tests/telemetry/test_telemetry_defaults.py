"""Telemetry defaults that fit the user: OTLP metrics only where meant, endpoints checked, hosts."""

from __future__ import annotations

import pytest

from leaseworker import ConfigError
from leaseworker._cli._main import build_parser
from leaseworker._cli._run_command import _telemetry
from leaseworker._telemetry import configure
from leaseworker_dev._services import free_port

JOB = "tests.jobs:MarkerJob"


@pytest.fixture(autouse=True)
def _no_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sets the OTEL_* variables it is about, and no others."""
    for name in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        "OTEL_METRICS_EXPORTER",
        "OTEL_TRACES_EXPORTER",
        "OTEL_SDK_DISABLED",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("env", "exporting"),
    [
        ({}, ["traces"]),  # Jaeger, say: it would answer metrics with 404 every minute
        ({"OTEL_METRICS_EXPORTER": "otlp"}, ["traces", "metrics"]),
        ({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://127.0.0.1:9/m"}, ["traces", "metrics"]),
        (
            {"OTEL_METRICS_EXPORTER": "none", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://x"},
            ["traces"],
        ),
    ],
)
def test_otlp_metrics_go_out_only_to_an_endpoint_meant_for_them(
    env: dict[str, str], exporting: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--otlp-endpoint`` alone exports traces; metrics need their endpoint or ``otlp`` said."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    configured = configure(pod="pod-a", otlp_endpoint="http://127.0.0.1:9")
    try:
        assert configured.exporting == exporting
    finally:
        configured.close(timeout=0.5)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("--otlp-endpoint", "notaurl"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "ftp://collector/v1/traces"),
        ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://"),
    ],
)
def test_an_endpoint_that_is_not_an_http_url_is_a_config_error_naming_its_setting(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the exporter failed at its first export, and again every minute."""
    if name.startswith("OTEL_"):
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=f"^{name}: '"):
        configure(pod="pod-a", otlp_endpoint=value if name == "--otlp-endpoint" else None)


def test_metrics_host_is_where_the_prometheus_endpoint_listens() -> None:
    """``--metrics-host 127.0.0.1`` binds there; before, /metrics always bound 0.0.0.0."""
    args = build_parser().parse_args(
        ["run", "--metrics-port", str(free_port()), "--metrics-host", "127.0.0.1", JOB]
    )
    configured = _telemetry(args, "pod-a")
    try:
        assert configured.metrics_server.server_address[0] == "127.0.0.1"
    finally:
        configured.close(timeout=0.5)
    default = build_parser().parse_args(["run", JOB])
    assert default.metrics_host == "0.0.0.0"
