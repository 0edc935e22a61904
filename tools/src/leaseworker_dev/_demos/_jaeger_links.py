"""Helpers for the demo: point pods at a local Jaeger, find a lost lease and its timeline.

``pod_environment`` gives the OTEL_* variables a ``leaseworker run`` pod needs to
export to a :class:`~leaseworker_dev._services.LocalJaeger` (traces only: Jaeger takes
no metrics); ``lost_trace_url`` polls Jaeger until a trace with an
``ownership lost`` span shows up and returns its URL; ``key_history`` polls it
until a job key's history shows a loss and its takeover.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from leaseworker.toolkit import SPAN_LOST, History, JaegerQuery, history_from_spans

if TYPE_CHECKING:
    from leaseworker.toolkit import JaegerSpan

    from .._services import LocalJaeger


def pod_environment(jaeger: LocalJaeger, service: str = "leaseworker") -> dict[str, str]:
    """Return the environment that makes a ``leaseworker run`` pod export to ``jaeger``."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_http_endpoint,
        "OTEL_SERVICE_NAME": service,
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }


def lost_trace_ids(spans: list[JaegerSpan]) -> list[str]:
    """Return the trace ids (oldest first) that contain an ``ownership lost`` span."""
    found: list[str] = []
    for span in spans:
        if span.name == SPAN_LOST and span.trace_id not in found:
            found.append(span.trace_id)
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


def key_history(
    jaeger: LocalJaeger, job_key: str, service: str = "leaseworker", *, within: float = 10.0
) -> History | None:
    """Poll ``jaeger`` up to ``within`` s for ``job_key``'s history: a lost execution taken over.

    Returns what it found last (``None`` when nothing): the pods flush their
    spans on exit, and Jaeger stores them a moment later (a relay's send span
    may come from another pod than its execution: it is waited for too).
    """
    query = JaegerQuery(jaeger.query_url, service=service)
    deadline = time.monotonic() + within
    history: History | None = None
    while True:
        found = history_from_spans(query.job_key(job_key, since=3600).spans, job_key)
        history = found if found.executions else history
        outcomes = [e.outcome for e in found.executions]
        if "lost" in outcomes and "completed" in outcomes and _all_sent(found):
            return history
        if time.monotonic() >= deadline:
            return history
        time.sleep(0.2)


def _all_sent(history: History) -> bool:
    """Whether every effect the history shows committed also shows sent."""
    steps = [step for e in history.executions for step in e.steps]
    committed = {s.attrs.get("effect_id") for s in steps if s.name == "effect_committed"}
    return committed <= {s.attrs.get("effect_id") for s in steps if s.name == "effect_sent"}
