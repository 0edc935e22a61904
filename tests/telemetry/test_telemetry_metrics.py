"""The pod's counters: sums kept by leaseworker, reported through observable instruments.

Pure unit tests on the real SDK (a MeterProvider and an in-memory reader, no
worker): what a reader collects must be what synchronous counters would have
given, cumulative monotonic sums per attribute set, and an up-down count.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Histogram, InMemoryMetricReader, Sum

from leaseworker._telemetry._metrics import MAX_PENDING, Metrics


def _sums(reader: InMemoryMetricReader) -> dict[str, tuple[bool, dict[Any, float]]]:
    data = reader.get_metrics_data()
    assert data is not None
    found: dict[str, tuple[bool, dict[Any, float]]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if isinstance(metric.data, Sum):
                    points = {
                        tuple(sorted((p.attributes or {}).items())): p.value
                        for p in metric.data.data_points
                    }
                    found[metric.name] = (metric.data.is_monotonic, points)
    return found


def test_counters_are_cumulative_sums_per_attribute_set_across_collections() -> None:
    """Two collections: each reports everything added so far, split by attributes."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    metrics = Metrics.create(provider.get_meter("t"))
    metrics.outcomes.add(1, {"leaseworker.outcome": "completed"})
    metrics.outcomes.add(1, {"leaseworker.outcome": "lost"})
    metrics.in_flight.add(1)
    metrics.in_flight.add(1)
    first = _sums(reader)
    metrics.outcomes.add(2, {"leaseworker.outcome": "completed"})
    metrics.in_flight.add(-2)
    second = _sums(reader)
    provider.shutdown()
    completed = (("leaseworker.outcome", "completed"),)
    lost = (("leaseworker.outcome", "lost"),)
    assert first["leaseworker.execution.outcomes"] == (True, {completed: 1, lost: 1})
    assert second["leaseworker.execution.outcomes"] == (True, {completed: 3, lost: 1})
    assert first["leaseworker.execution.in_flight"] == (False, {(): 2})
    assert second["leaseworker.execution.in_flight"] == (False, {(): 0})


def _counts(reader: InMemoryMetricReader, name: str) -> dict[Any, int]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        tuple(sorted((p.attributes or {}).items())): p.count
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name and isinstance(metric.data, Histogram)
        for p in metric.data.data_points
    }


def test_histogram_values_kept_on_the_loop_are_in_every_collection() -> None:
    """Durations are recorded when a reader collects: each collection has all so far.

    With no reader collecting, at most ``MAX_PENDING`` values wait: the next
    one records them.
    """
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    metrics = Metrics.create(provider.get_meter("t"))
    completed = (("leaseworker.outcome", "completed"),)
    metrics.duration.record(0.5, {"leaseworker.outcome": "completed"})
    metrics.duration.record(1.5, {"leaseworker.outcome": "completed"})
    assert _counts(reader, "leaseworker.execution.duration") == {completed: 2}
    metrics.duration.record(2.5, {"leaseworker.outcome": "completed"})
    assert _counts(reader, "leaseworker.execution.duration") == {completed: 3}
    for _ in range(MAX_PENDING):
        metrics.renewal.record(0.001, {"leaseworker.renewal.outcome": "renewed"})
    assert len(metrics.renewal._pending) == 0  # recorded by the last record: none waits
    provider.shutdown()
