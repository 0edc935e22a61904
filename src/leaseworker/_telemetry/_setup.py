"""Telemetry for ``leaseworker run`` and ``trigger``, configured from OTEL_* and flags.

The only place the SDK and exporters are imported, lazily; without an endpoint
nothing is exported and nothing fails, and shutdown flushes in a thread with a
deadline. The variables and flags: docs/telemetry.md#turning-it-on; the design:
docs/design.md#set-up.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, final

import anyio

from .._errors import ConfigError
from ._collector import check_collector
from ._export_seam import fast_path_fits
from ._telemetry import Telemetry

logger = logging.getLogger("leaseworker.telemetry")

DEFAULT_SERVICE_NAME = "leaseworker"
SWITCH_INTERVAL = 0.001
"""Seconds the span export thread may keep the GIL while the event loop waits for it.

CPython's default is 5 ms: each time the loop wakes (a socket ready, a timer
due) while the export thread is encoding, it may wait that long for the GIL.
Set by :func:`configure` once spans are exported (never lengthened).
"""
SHUTDOWN_TIMEOUT = 5.0
"""Seconds pod exit waits for the last spans and metrics to be exported."""


@final
@dataclass(eq=False)
class ConfiguredTelemetry:
    """A :class:`Telemetry` plus the SDK pieces behind it, which :meth:`aclose` shuts down."""

    telemetry: Telemetry
    tracer_provider: Any = None
    meter_provider: Any = None
    metrics_server: Any = None
    exporting: list[str] = field(default_factory=list)
    _closed: bool = False

    @property
    def metrics_port(self) -> int | None:
        """The port the Prometheus endpoint listens on (``None`` when it is off)."""
        return None if self.metrics_server is None else int(self.metrics_server.server_port)

    def close(self, timeout: float = SHUTDOWN_TIMEOUT) -> None:
        """Flush and shut everything down (blocking; at most about ``timeout`` per signal)."""
        if self._closed:
            return
        self._closed = True
        millis = int(timeout * 1000)
        for provider in (self.tracer_provider, self.meter_provider):
            if provider is not None:
                try:
                    provider.force_flush(timeout_millis=millis)
                    provider.shutdown()
                except Exception:
                    logger.exception("telemetry shutdown failed")
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()

    async def aclose(self, within: float = SHUTDOWN_TIMEOUT) -> None:
        """Run :meth:`close` in a daemon thread, given up after ``within`` seconds.

        The event loop is never blocked by a slow or unreachable collector, and
        neither is the process's exit: the SDK's flush and shutdown do not all
        honour their timeouts (a batch being posted runs to the exporter's own
        timeout and retries), and the interpreter waits for every non-daemon
        thread, anyio's worker threads included, before it exits.
        """
        closing = threading.Thread(
            target=self.close, args=(within,), name="leaseworker telemetry close", daemon=True
        )
        closing.start()
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(closing.join, within)
        if closing.is_alive():
            logger.warning(
                "telemetry did not flush within %.1fs; the last spans may be lost",
                within,
                extra={"event": "telemetry_flush_timeout"},
            )


ENDPOINT_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)
"""The OTLP endpoint variables :func:`configure` checks (after ``--otlp-endpoint``)."""


def configure(
    *,
    pod: str,
    otlp_endpoint: str | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "0.0.0.0",  # Prometheus scrapes the pod from outside
    check_collector: bool = False,
) -> ConfiguredTelemetry:
    """Build the telemetry of one process from the OTEL_* variables and the flags.

    An endpoint that is not an ``http(s)://`` URL raises :class:`ConfigError`;
    with ``check_collector`` (the CLI's commands) so does a collector that
    refuses the spans at start (401/403, a certificate that does not verify:
    see ``_collector``). HTTPS uses the SDK's own TLS variables
    (``OTEL_EXPORTER_OTLP_CERTIFICATE``, ``..._CLIENT_CERTIFICATE``/``_KEY``).
    OTLP metrics are off unless configured for themselves (see ``_otlp_metrics``);
    ``metrics_port`` serves Prometheus on ``metrics_host``.
    """
    if _env_true("OTEL_SDK_DISABLED"):
        return ConfiguredTelemetry(Telemetry())
    endpoint = (otlp_endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "").rstrip("/")
    # Only the flag is turned into URLs here. From the environment, the SDK's
    # exporters resolve them as the spec says: a signal's own variable
    # (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) wins over the shared one.
    flag = (otlp_endpoint or "").rstrip("/")
    traces = bool(endpoint or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
    traces = traces and os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip() != "none"
    _check_endpoint("--otlp-endpoint", flag)
    for name in ENDPOINT_VARIABLES:
        _check_endpoint(name, os.environ.get(name))
    otlp_metrics = _otlp_metrics(endpoint)
    if not (traces or otlp_metrics or metrics_port is not None):
        return ConfiguredTelemetry(Telemetry())
    configured = ConfiguredTelemetry(Telemetry())
    resource = _resource(pod)
    if traces:
        configured.tracer_provider = _tracer_provider(
            resource, flag, _traces_protocol(), check=check_collector
        )
        configured.exporting.append("traces")
    readers: list[Any] = []
    if otlp_metrics:
        readers.append(_otlp_metric_reader(flag))
        configured.exporting.append("metrics")
    if metrics_port is not None:
        reader, configured.metrics_server = _prometheus(metrics_host, metrics_port)
        readers.append(reader)
        configured.exporting.append(f"prometheus :{configured.metrics_port}")
    if readers:
        from opentelemetry.sdk.metrics import MeterProvider

        configured.meter_provider = MeterProvider(metric_readers=readers, resource=resource)
    configured.telemetry = Telemetry(
        tracer_provider=configured.tracer_provider, meter_provider=configured.meter_provider
    )
    return configured


def _check_endpoint(name: str, value: str | None) -> None:
    """Raise ConfigError unless ``value`` (when set) is an ``http://`` or ``https://`` URL.

    The exporters would only fail at their first export, once a minute, forever.
    """
    if not value:
        return
    try:
        parts = urllib.parse.urlsplit(value.strip())
        parts.port  # noqa: B018 - parsing the port raises ValueError for a bad one
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"{name}: {value!r} is not an OTLP/HTTP endpoint such as http://collector:4318"
        )


def _otlp_metrics(endpoint: str) -> bool:
    """Whether metrics go out over OTLP: only to an endpoint meant for them.

    A metrics endpoint of their own (``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``),
    or the shared endpoint with ``OTEL_METRICS_EXPORTER=otlp`` said outright.
    The shared endpoint alone (``--otlp-endpoint``) gets traces only: Jaeger,
    the usual target, answers metrics with 404 every minute.
    """
    chosen = os.environ.get("OTEL_METRICS_EXPORTER", "").strip()
    if chosen == "none":
        return False
    if os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        return True
    return chosen == "otlp" and bool(endpoint)


def _resource(pod: str) -> Any:
    from opentelemetry.sdk.resources import Resource

    attributes: dict[str, str] = {"service.instance.id": pod}
    declared = os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    if not os.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in declared:
        attributes["service.name"] = DEFAULT_SERVICE_NAME
    if "service.instance.id=" in declared:
        del attributes["service.instance.id"]
    return Resource.create(attributes)


def _traces_protocol() -> str:
    """``http/json`` (leaseworker's default, the cheaper encoding) or ``http/protobuf``."""
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/json"
    ).strip()
    if protocol not in ("http/json", "http/protobuf"):
        logger.warning("OTLP protocol %s ignored: leaseworker speaks OTLP over HTTP", protocol)
        return "http/json"
    return protocol


def _tracer_provider(
    resource: Any, endpoint: str, protocol: str = "http/json", *, check: bool = False
) -> Any:
    """Return leaseworker's lean provider, configured as the SDK's would be (see ``_lean``).

    ``endpoint``: the ``--otlp-endpoint`` flag; empty, the exporter reads OTEL_*.
    ``check``: ask the collector first (``_collector``; ConfigError if it refuses).
    With an OpenTelemetry the export's fast path was not read from
    (``_export_seam.fast_path_fits``, one WARNING), the SDK's batch processor and
    protobuf exporter export the spans, and the collector is not asked.
    """
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from ._lean import LeanTracerProvider
    from ._span_batch import LeanBatchProcessor

    fast = fast_path_fits()
    # The SDK provider reads OTEL_TRACES_SAMPLER(_ARG): the sampler is its decision.
    sdk = TracerProvider(resource=resource, shutdown_on_exit=False)
    provider = LeanTracerProvider(resource, sdk.sampler, id_generator=sdk.id_generator)
    url = f"{endpoint}/v1/traces" if endpoint else None
    exporter = _span_exporter(url, protocol if fast else "http/protobuf")
    if check and fast:
        try:
            check_collector(exporter)
        except ConfigError:
            exporter.shutdown()
            raise
    processor: SpanProcessor = (
        LeanBatchProcessor(exporter) if fast else BatchSpanProcessor(exporter)
    )
    provider.add_span_processor(processor)
    sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
    return provider


def _span_exporter(url: str | None, protocol: str) -> Any:
    """Return the OTLP/HTTP span exporter: JSON by default (see ``_otlp_json``), else protobuf.

    Both read the endpoint (when ``url`` is ``None``), headers, timeout,
    compression and TLS files from the ``OTEL_EXPORTER_OTLP_*`` variables the
    same way: the JSON one sends through the SDK exporter's own client.
    """
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    if protocol == "http/json":
        from ._otlp_json import OtlpJsonSpanExporter

        try:
            return OtlpJsonSpanExporter(endpoint=url)
        except TypeError:
            logger.warning("OTLP/JSON span export unavailable with this SDK; using protobuf")
    return OTLPSpanExporter(endpoint=url)


def _otlp_metric_reader(endpoint: str) -> Any:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    exporter = OTLPMetricExporter(endpoint=f"{endpoint}/v1/metrics" if endpoint else None)
    return PeriodicExportingMetricReader(exporter)


def _prometheus(host: str, port: int) -> tuple[Any, Any]:
    """Return a Prometheus reader on a registry of its own, served on ``host:port``."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    reader = PrometheusMetricReader(registry=registry)
    server, thread = start_http_server(port, addr=host, registry=registry)
    assert isinstance(thread, threading.Thread)
    return reader, server


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() == "true"
