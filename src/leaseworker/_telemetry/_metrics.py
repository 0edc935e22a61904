"""The pod's OpenTelemetry instruments: the numbers an incident review asks for.

How long executions take and how they end, how long renewals take, how often
and why ownership is lost, how long a job took to stop after a loss, how long a
job key may have run twice, what is in flight, what was received, committed and
dead-lettered. Labels are low-cardinality only (outcome, reason, topic): job
keys and execution ids go into spans and logs, never into metric labels.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import final

from opentelemetry.metrics import CallbackOptions, Histogram, Meter, Observation
from opentelemetry.util.types import AttributeValue

from . import _names as n

_SECONDS_SHORT = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Buckets for Redis round trips and stop latencies (seconds)."""

_SECONDS_LONG = (0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0)
"""Buckets for execution durations (seconds): report jobs run for minutes."""


@final
class Tally:
    """A sum per attribute set, kept here and reported when a reader collects.

    Why: the SDK's synchronous ``Counter.add`` does attribute-set hashing, a
    lock and the aggregation on every call, and a trigger makes five of them;
    summing into a dict costs a small fraction of that (docs/design.md#pod-telemetry-and-sampling).
    The observable instrument built on :meth:`observe` reports the same
    cumulative sums, so exporters and Prometheus see the same series.
    ``add`` runs on the event loop, ``observe`` in a reader's thread: it
    copies the dict in one step (no Python code runs during the copy).
    """

    __slots__ = ("_sums",)

    def __init__(self) -> None:
        self._sums: dict[tuple[tuple[str, AttributeValue], ...], float] = {}

    def add(self, amount: float, attributes: Mapping[str, AttributeValue] | None = None) -> None:
        """Add ``amount`` to the sum of ``attributes`` (low-cardinality labels only)."""
        key = tuple(attributes.items()) if attributes else ()
        self._sums[key] = self._sums.get(key, 0) + amount

    def observe(self, _options: CallbackOptions) -> Iterable[Observation]:
        """Report every sum so far (the instrument's callback)."""
        return [Observation(total, dict(key)) for key, total in list(self._sums.items())]


MAX_PENDING = 4_096
"""Values a :class:`Deferred` histogram keeps before it records them itself."""


@final
class Deferred:
    """A histogram's values, kept on the event loop and recorded when a reader collects.

    Why: the SDK's ``Histogram.record`` costs 12-15 µs (attribute hashing,
    a lock, the buckets, an exemplar offered), once per trigger on the event
    loop; a deque append costs a fraction. A reader's collection calls every
    observable instrument's callback before it reads the histograms:
    :meth:`flush` is one of those callbacks, so every collection sees every
    value recorded before it (without exemplars: the values are recorded
    from the reader's thread). With no reader collecting, :meth:`record`
    records what waits once :data:`MAX_PENDING` values do.
    """

    __slots__ = ("_histogram", "_pending")

    def __init__(self, histogram: Histogram) -> None:
        self._histogram = histogram
        self._pending: collections.deque[tuple[float, Mapping[str, AttributeValue] | None]] = (
            collections.deque()
        )

    def record(self, amount: float, attributes: Mapping[str, AttributeValue] | None = None) -> None:
        """Keep ``amount`` for the histogram (low-cardinality ``attributes`` only)."""
        pending = self._pending
        pending.append((amount, attributes))
        if len(pending) >= MAX_PENDING:
            self.flush()

    def flush(self, _options: CallbackOptions | None = None) -> Iterable[Observation]:
        """Record every value kept so far (an observable instrument's callback: observes none)."""
        pending, record = self._pending, self._histogram.record
        while pending:  # popleft: the loop may append meanwhile (deques are thread-safe)
            amount, attributes = pending.popleft()
            record(amount, attributes)
        return ()


@final
class Latest:
    """The last value a gauge was told, with its labels (the outbox backlog a relay sampled)."""

    __slots__ = ("attributes", "value")

    def __init__(self) -> None:
        self.value: float | None = None
        self.attributes: Mapping[str, str] = {}

    def observe(self, _options: CallbackOptions) -> Iterable[Observation]:
        """Report the last value, if there is one (the instrument's callback)."""
        value = self.value
        return [] if value is None else [Observation(value, self.attributes)]


@dataclass(frozen=True, slots=True)
class Metrics:
    """Every instrument leaseworker records, created once per meter.

    Counters are :class:`Tally` s behind observable instruments (cumulative
    sums, the same series a synchronous counter gives); histograms are the
    SDK's own, fed through :class:`Deferred`.
    """

    duration: Deferred
    outcomes: Tally
    in_flight: Tally
    overlap: Tally
    cpu: Tally
    renewal: Deferred
    losses: Tally
    stop_latency: Deferred
    received: Tally
    committed: Tally
    dead_letters: Tally
    completions: Tally
    lost_repeatedly: Tally
    outbox_depth: Latest
    outbox_age: Latest
    effects_sent: Tally
    send_failures: Tally
    effects_received: Tally

    @classmethod
    def create(cls, meter: Meter) -> Metrics:
        """Create the instruments on ``meter``."""

        def counter(name: str, unit: str, description: str) -> Tally:
            tally = Tally()
            meter.create_observable_counter(
                name, callbacks=[tally.observe], unit=unit, description=description
            )
            return tally

        def gauge(name: str, unit: str, description: str) -> Latest:
            latest = Latest()
            meter.create_observable_gauge(
                name, callbacks=[latest.observe], unit=unit, description=description
            )
            return latest

        def histogram(name: str, description: str, buckets: tuple[float, ...]) -> Deferred:
            return Deferred(
                meter.create_histogram(
                    name,
                    unit="s",
                    description=description,
                    explicit_bucket_boundaries_advisory=buckets,
                )
            )

        duration = histogram(
            n.METRIC_DURATION, "Execution duration (acquire to end), by outcome", _SECONDS_LONG
        )
        renewal = histogram(
            n.METRIC_RENEWAL, "Lease renewal round trip, by renewal outcome", _SECONDS_SHORT
        )
        stop_latency = histogram(
            n.METRIC_STOP_LATENCY,
            "Time from an ownership loss until the job actually stopped",
            _SECONDS_SHORT,
        )
        in_flight = Tally()
        meter.create_observable_up_down_counter(
            n.METRIC_IN_FLIGHT,
            # The histograms' kept values are recorded first, in each collection.
            callbacks=[duration.flush, renewal.flush, stop_latency.flush, in_flight.observe],
            unit="{execution}",
            description="Executions holding their lease and running their job now",
        )
        return cls(
            duration=duration,
            outcomes=counter(n.METRIC_OUTCOMES, "{execution}", "Executions ended, by outcome"),
            in_flight=in_flight,
            overlap=counter(
                n.METRIC_OVERLAP,
                "s",
                "Seconds a job key may have had more than one execution running, "
                "as far as this pod can know (upper bound)",
            ),
            cpu=counter(
                n.METRIC_CPU,
                "s",
                "CPU seconds executions spent in run_in_process children (killed ones "
                "included), by outcome and reason: what lost and stale executions wasted",
            ),
            renewal=renewal,
            losses=counter(n.METRIC_LOSSES, "{loss}", "Lease ownership losses, by reason"),
            stop_latency=stop_latency,
            received=counter(n.METRIC_RECEIVED, "{trigger}", "Triggers handed to executions"),
            committed=counter(
                n.METRIC_COMMITTED, "{trigger}", "Triggers whose offsets were committed"
            ),
            dead_letters=counter(
                n.METRIC_DEAD_LETTERS,
                "{record}",
                "Records copied to the dead-letter topic, by reason",
            ),
            completions=counter(
                n.METRIC_COMPLETIONS,
                "{completion}",
                "Completion store answers: accepted, duplicate, stale",
            ),
            lost_repeatedly=counter(
                n.METRIC_LOST_REPEATEDLY,
                "{trigger}",
                "Triggers given up after their loss budget, by the last loss's reason",
            ),
            outbox_depth=gauge(
                n.METRIC_OUTBOX_DEPTH, "{message}", "Committed messages not sent yet (the store's)"
            ),
            outbox_age=gauge(
                n.METRIC_OUTBOX_AGE, "s", "Age of the oldest unsent message (0: none unsent)"
            ),
            effects_sent=counter(
                n.METRIC_EFFECTS_SENT, "{message}", "Outbox messages the broker acknowledged"
            ),
            send_failures=counter(
                n.METRIC_SEND_FAILURES, "{message}", "Outbox sends that failed (retried), by topic"
            ),
            effects_received=counter(
                n.METRIC_EFFECTS_RECEIVED,
                "{effect}",
                "Effects a receiver's inbox answered: new, duplicate or stale (dropped)",
            ),
        )
