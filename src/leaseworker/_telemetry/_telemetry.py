"""``Telemetry``: where a worker's spans and metrics go, chosen by whoever builds it.

The providers are injected, never taken from OpenTelemetry's globals, so tests
and embedding applications decide where leaseworker's telemetry goes (and a
library never reconfigures its host). Without providers everything is a no-op.
"""

from __future__ import annotations

from typing import final

from opentelemetry.metrics import MeterProvider, NoOpMeterProvider
from opentelemetry.trace import NoOpTracerProvider, TracerProvider

from .._version import __version__
from ._metrics import Metrics
from ._pod import PodTelemetry

SCHEMA_URL = "https://opentelemetry.io/schemas/1.27.0"
"""The semantic-conventions version leaseworker's attribute names follow."""


@final
class Telemetry:
    """Traces and metrics for workers, from injected OpenTelemetry providers.

    ::

        provider = TracerProvider(resource=Resource.create({"service.name": "reports"}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        worker = Pod(MonthlyReport(), config, telemetry=Telemetry(tracer_provider=provider))

    ``parent_on_producer``: the ``process {topic}`` span is a child of the
    producer's span from the record's ``traceparent`` (one trace from request
    to report); with ``False`` each trigger starts a new trace that only links
    to the producer. The caller owns the providers and shuts them down.
    """

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        parent_on_producer: bool = True,
    ) -> None:
        self._tracer = (tracer_provider or NoOpTracerProvider()).get_tracer(
            "leaseworker", __version__, schema_url=SCHEMA_URL
        )
        meter = (meter_provider or NoOpMeterProvider()).get_meter(
            "leaseworker", __version__, schema_url=SCHEMA_URL
        )
        self._metrics = Metrics.create(meter)
        self._parent_on_producer = parent_on_producer
        self._enabled = tracer_provider is not None or meter_provider is not None

    @property
    def enabled(self) -> bool:
        """Whether a provider was given: without one every span and metric is a no-op.

        A worker then skips the telemetry hooks altogether (no trace state,
        attribute dicts or no-op spans per trigger).
        """
        return self._enabled

    def instrument(self, *, pod: str, group: str | None = None) -> PodTelemetry:
        """Return the observers and hooks of one pod (``group``: its Kafka consumer group)."""
        return PodTelemetry(
            self._tracer,
            self._metrics,
            pod=pod,
            group=group,
            parent_on_producer=self._parent_on_producer,
            enabled=self._enabled,
        )
