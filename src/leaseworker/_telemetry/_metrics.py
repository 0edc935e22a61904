"""The pod's OpenTelemetry instruments: the numbers an incident review asks for.

How long executions take and how they end, how long renewals take, how often
and why ownership is lost, how long a job took to stop after a loss, how long a
job key may have run twice, what is in flight, what was received, committed and
dead-lettered. Labels are low-cardinality only (outcome, reason, topic): job
keys and execution ids go into spans and logs, never into metric labels.
"""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.metrics import Counter, Histogram, Meter, UpDownCounter

from . import _names as n

_SECONDS_SHORT = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Buckets for Redis round trips and stop latencies (seconds)."""

_SECONDS_LONG = (0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0)
"""Buckets for execution durations (seconds): report jobs run for minutes."""


@dataclass(frozen=True, slots=True)
class Metrics:
    """Every instrument leaseworker records, created once per meter."""

    duration: Histogram
    outcomes: Counter
    in_flight: UpDownCounter
    overlap: Counter
    renewal: Histogram
    losses: Counter
    stop_latency: Histogram
    received: Counter
    committed: Counter
    dead_letters: Counter
    completions: Counter

    @classmethod
    def create(cls, meter: Meter) -> Metrics:
        """Create the instruments on ``meter``."""
        return cls(
            duration=meter.create_histogram(
                n.METRIC_DURATION,
                unit="s",
                description="Execution duration (acquire to end), by outcome",
                explicit_bucket_boundaries_advisory=_SECONDS_LONG,
            ),
            outcomes=meter.create_counter(
                n.METRIC_OUTCOMES, unit="{execution}", description="Executions ended, by outcome"
            ),
            in_flight=meter.create_up_down_counter(
                n.METRIC_IN_FLIGHT,
                unit="{execution}",
                description="Executions holding their lease and running their job now",
            ),
            overlap=meter.create_counter(
                n.METRIC_OVERLAP,
                unit="s",
                description="Seconds a job key may have had more than one execution running, "
                "as far as this pod can know (upper bound)",
            ),
            renewal=meter.create_histogram(
                n.METRIC_RENEWAL,
                unit="s",
                description="Lease renewal round trip, by renewal outcome",
                explicit_bucket_boundaries_advisory=_SECONDS_SHORT,
            ),
            losses=meter.create_counter(
                n.METRIC_LOSSES, unit="{loss}", description="Lease ownership losses, by reason"
            ),
            stop_latency=meter.create_histogram(
                n.METRIC_STOP_LATENCY,
                unit="s",
                description="Time from an ownership loss until the job actually stopped",
                explicit_bucket_boundaries_advisory=_SECONDS_SHORT,
            ),
            received=meter.create_counter(
                n.METRIC_RECEIVED, unit="{trigger}", description="Triggers handed to executions"
            ),
            committed=meter.create_counter(
                n.METRIC_COMMITTED,
                unit="{trigger}",
                description="Triggers whose offsets were committed",
            ),
            dead_letters=meter.create_counter(
                n.METRIC_DEAD_LETTERS,
                unit="{record}",
                description="Records copied to the dead-letter topic, by reason",
            ),
            completions=meter.create_counter(
                n.METRIC_COMPLETIONS,
                unit="{completion}",
                description="Completion store answers: accepted, duplicate, stale",
            ),
        )
