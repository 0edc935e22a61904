"""Helpers for the demo: point pods at a local Jaeger and find the trace of a lost lease.

``pod_environment`` gives the OTEL_* variables a ``leaseworker run`` pod needs to
export to a :class:`~leaseworker._dev._services.LocalJaeger` (traces only: Jaeger takes
no metrics); ``lost_trace_url`` polls Jaeger until a trace with an
``ownership lost`` span shows up and returns its URL.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .._telemetry import _names as n

if TYPE_CHECKING:
    from ._services._jaeger import FoundSpan, LocalJaeger


def pod_environment(jaeger: LocalJaeger, service: str = "leaseworker") -> dict[str, str]:
    """Return the environment that makes a ``leaseworker run`` pod export to ``jaeger``."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_http_endpoint,
        "OTEL_SERVICE_NAME": service,
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }


def lost_trace_ids(spans: list[FoundSpan]) -> list[str]:
    """Return the trace ids (oldest first) that contain an ``ownership lost`` span."""
    found: list[str] = []
    for span in spans:
        if span["name"] == n.SPAN_LOST and span["trace_id"] not in found:
            found.append(span["trace_id"])
    return found


def lost_trace_url(
    jaeger: LocalJaeger, service: str = "leaseworker", *, within: float = 10.0
) -> str | None:
    """Poll ``jaeger`` up to ``within`` seconds; return the first lost execution's trace URL."""
    deadline = time.monotonic() + within
    while True:
        ids = lost_trace_ids(jaeger.find_traces(service))
        if ids:
            return jaeger.trace_url(ids[0])
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.2)
