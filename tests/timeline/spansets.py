"""Crafted span sets, shaped like a pod's (names and attributes as docs/telemetry.md lists).

Each scenario builds the spans of every trace of one job key, as Jaeger would
return them: a ``process`` span per trigger, the lifecycle spans as its
children, a ``commit`` span. Times are seconds after :data:`T0` (Unix).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

from leaseworker._timeline import Span
from leaseworker.toolkit import Scalar

T0 = 1_796_000_000.0  # 2026-11-30 ... UTC
KEY = "report:acme:2026-11"
TOPIC = "reports.requested"

_ids = itertools.count(1)


@dataclass
class Trigger:
    """One trigger's trace on one pod; ``span`` adds a child span to it."""

    pod: str
    offset: int
    partition: int = 0
    trace_id: str = field(default_factory=lambda: f"{next(_ids):032x}")
    spans: list[Span] = field(default_factory=list)

    def common(self, execution: str | None, fence: int | None) -> dict[str, Scalar]:
        """Return the attributes every span of this trace carries."""
        attrs: dict[str, Scalar] = {
            "messaging.destination.name": TOPIC,
            "messaging.destination.partition.id": str(self.partition),
            "messaging.kafka.offset": self.offset,
            "leaseworker.pod": self.pod,
            "leaseworker.job.key": KEY,
        }
        if execution is not None:
            attrs["leaseworker.execution.id"] = execution
        if fence is not None:
            attrs["leaseworker.fence"] = fence
        return attrs

    def span(
        self,
        name: str,
        start: float,
        end: float | None = None,
        *,
        execution: str | None,
        fence: int | None = None,
        error: bool = False,
        **attrs: Scalar,
    ) -> Trigger:
        """Add a span; ``attrs`` are leaseworker attributes, ``__`` for a dot."""
        extra = {f"leaseworker.{k.replace('__', '.')}": v for k, v in attrs.items()}
        self.spans.append(
            Span(
                trace_id=self.trace_id,
                span_id=f"{next(_ids):016x}",
                name=name,
                start=T0 + start,
                end=T0 + (start if end is None else end),
                attributes={**self.common(execution, fence), **extra},
                error=error,
                service="leaseworker",
            )
        )
        return self

    def process(self, start: float, end: float, execution: str, outcome: str) -> Trigger:
        """Add the trigger's ``process`` span."""
        return self.span(f"process {TOPIC}", start, end, execution=execution, outcome=outcome)

    def held(self, execution: str, fence: int, acquired: float, previous: str = "") -> Trigger:
        """The acquire span ending at ``acquired`` (a 2 ms round trip)."""
        self.span(
            "lease acquire",
            acquired - 0.002,
            acquired,
            execution=execution,
            fence=fence,
            outcome="acquired",
            lease__wait_ms=2.0,
        )
        if previous:  # the takeover names the execution it succeeded
            attrs = dict(self.spans[-1].attributes)
            attrs["leaseworker.previous.execution.id"] = previous
            self.spans[-1] = replace(self.spans[-1], attributes=attrs)
        return self

    def renewals(self, execution: str, fence: int, times: list[float]) -> Trigger:
        """Add a confirmed renewal sent at each of ``times``."""
        for at in times:
            self.span(
                "lease renew",
                at,
                at + 0.001,
                execution=execution,
                fence=fence,
                renewal__outcome="renewed",
            )
        return self

    def finish(
        self, execution: str, fence: int, ran: tuple[float, float], outcome: str, status: str
    ) -> Trigger:
        """``job run``, the completion answer, the release and the commit."""
        start, end = ran
        self.span("job run", start, end, execution=execution, fence=fence, outcome=outcome)
        self.span(
            "completion",
            end - 0.01,
            end,
            execution=execution,
            fence=fence,
            completion__status=status,
        )
        self.span(
            "lease release",
            end + 0.001,
            end + 0.003,
            execution=execution,
            fence=fence,
            release__deleted=True,
        )
        self.span(
            f"commit {TOPIC}",
            end + 0.1,
            end + 0.105,
            execution=execution,
            fence=fence,
            commit__position=self.offset + 1,
        )
        return self


def _loss(trigger: Trigger, execution: str, fence: int, sent: float, verdict: float) -> None:
    """A renewal sent at ``sent`` that timed out at ``verdict``: lost, cancelled, stopped."""
    trigger.span(
        "lease renew",
        sent,
        verdict,
        execution=execution,
        fence=fence,
        error=True,
        renewal__outcome="timeout",
    )
    trigger.span(
        "ownership lost",
        verdict,
        execution=execution,
        fence=fence,
        error=True,
        loss__reason="timeout",
    )
    trigger.span(
        "cancel requested", verdict, execution=execution, fence=fence, loss__reason="timeout"
    )
    trigger.span(
        "job stopped",
        verdict,
        verdict + 0.004,
        execution=execution,
        fence=fence,
        stop_latency_ms=4.0,
    )


def loss_and_takeover() -> list[Span]:
    """Pod A's Redis stalls: its renewal times out, it stops; pod B takes over and completes."""
    a = Trigger("pod-a", offset=7)
    a.process(0.0, 4.2, "a1", "lost").held("a1", 100, 0.05).renewals("a1", 100, [1.05, 2.05])
    _loss(a, "a1", 100, 3.05, 3.55)
    a.span("job run", 0.05, 3.554, execution="a1", fence=100, outcome="lost")
    a.span(
        "lease release",
        3.556,
        4.056,
        execution="a1",
        fence=100,
        error=True,
        error__type="TimeoutError",
    )
    b = Trigger("pod-b", offset=7)
    b.process(4.5, 9.3, "b1", "completed").held("b1", 101, 5.2, "a1")
    b.renewals("b1", 101, [6.2, 7.2, 8.2]).finish("b1", 101, (5.2, 9.0), "completed", "accepted")
    return a.spans + b.spans


def paused_overlap_stale() -> list[Span]:
    """Pod A is frozen past its lease; B takes over and completes; A wakes and gets ``stale``."""
    a = Trigger("pod-a", offset=3)
    a.process(0.0, 5.1, "a1", "lost").held("a1", 200, 0.02)
    b = Trigger("pod-b", offset=0, partition=1)
    b.process(1.0, 4.3, "b1", "completed").held("b1", 201, 2.05, "a1")
    b.renewals("b1", 201, [2.7, 3.35]).finish("b1", 201, (2.05, 4.0), "completed", "accepted")
    a.span(
        "ownership lost", 4.6, execution="a1", fence=200, error=True, loss__reason="loop_blocked"
    )
    a.span("job stopped", 1.93, 4.6, execution="a1", fence=200, stop_latency_ms=2670.0)
    a.span("job run", 0.02, 4.6, execution="a1", fence=200, outcome="lost")
    a.span("completion", 4.59, 4.6, execution="a1", fence=200, completion__status="stale")
    a.span("lease release", 4.601, 4.603, execution="a1", fence=200, release__deleted=False)
    a.span(f"commit {TOPIC}", 4.9, 4.91, execution="a1", fence=200, commit__position=4)
    return a.spans + b.spans


def duplicates() -> list[Span]:
    """A completes; a redelivery is answered from the store; a racing claim finds it done."""
    a = Trigger("pod-a", offset=1)
    a.process(0.0, 2.2, "a1", "completed").held("a1", 300, 0.1)
    a.renewals("a1", 300, [1.1]).finish("a1", 300, (0.1, 2.0), "completed", "accepted")
    b = Trigger("pod-b", offset=2)
    b.process(3.0, 3.01, "b1", "duplicate")  # looked up before acquiring: no lease
    c = Trigger("pod-c", offset=3)
    c.process(2.5, 4.2, "c1", "duplicate").held("c1", 301, 3.5)
    c.span("completion", 3.5, 3.51, execution="c1", fence=301, completion__status="duplicate")
    c.span("lease release", 3.511, 3.513, execution="c1", fence=301, release__deleted=True)
    c.span(f"commit {TOPIC}", 3.7, 3.705, execution="c1", fence=301, commit__position=4)
    return a.spans + b.spans + c.spans


SCENARIOS = {
    "loss_and_takeover": loss_and_takeover,
    "paused_overlap_stale": paused_overlap_stale,
    "duplicates": duplicates,
}
