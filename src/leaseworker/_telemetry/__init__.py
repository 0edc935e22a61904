"""Telemetry: OpenTelemetry spans and metrics, JSON logs, and their setup.

``_names`` holds every span, attribute and metric name; ``_propagation`` W3C
trace context in Kafka headers; ``_trace`` one trigger's trace state;
``_pod`` a pod's hook (execution, lease and source events); ``_lease_spans`` one
execution's lease events; ``_metrics`` the instruments; ``_telemetry`` the
public :class:`Telemetry` (injected providers); ``_log_format`` the JSON formatter;
``_send_spans`` the ``send`` side; ``_setup`` OTEL_*/flag configuration for the
CLI (the only place the SDK is imported, lazily); ``_otlp_json`` the OTLP/JSON
span exporter ``_setup`` uses (SDK imports); ``_lean`` the lean tracer
provider it builds; ``_span_batch`` its batch processor; ``_span_records`` the spans
made as tuples; ``_export_seam`` the one module using OpenTelemetry's private
names (the version check the set-up stands down on).
Only the OpenTelemetry API is imported at package import.

The names other boxes use: the ones below; :data:`names` (span, attribute and
metric names, for the timeline and the dev services); ``ERROR_OUTCOMES``
(outcomes that make a span an error) and ``RENEWAL_LOSSES`` (loss reasons that
are a renewal's answer).
"""

from . import _names as names
from ._lease_spans import ERROR_OUTCOMES as ERROR_OUTCOMES
from ._lease_spans import RENEWAL_LOSSES as RENEWAL_LOSSES
from ._log_format import JsonFormatter as JsonFormatter
from ._log_format import TextFormatter as TextFormatter
from ._names import SPAN_LOST as SPAN_LOST
from ._pod import PodTelemetry as PodTelemetry
from ._propagation import extract as extract
from ._propagation import inject as inject
from ._send_spans import OutgoingTrigger as OutgoingTrigger
from ._send_spans import traced_send as traced_send
from ._setup import ConfiguredTelemetry as ConfiguredTelemetry
from ._setup import configure as configure
from ._telemetry import Telemetry as Telemetry

__all__ = [
    "ERROR_OUTCOMES",
    "RENEWAL_LOSSES",
    "SPAN_LOST",
    "ConfiguredTelemetry",
    "JsonFormatter",
    "OutgoingTrigger",
    "PodTelemetry",
    "Telemetry",
    "TextFormatter",
    "configure",
    "extract",
    "inject",
    "names",
    "traced_send",
]
