"""What an effect's telemetry costs, and where: the execution's publish vs the relay's send.

A job's ``ctx.publish()`` runs in the execution: with a pod's telemetry it
makes the ``publish {topic}`` span and writes its trace context into the
message. The relay's ``send {topic}`` span is made in the relay's task once
the broker answered: it is on the relay's path, never the execution's. This
measures both, per message, in one process (no broker or store: the cost
of the calls themselves), against ``publish`` without telemetry (hooks
absent). Spans go through the lean tracer provider ``leaseworker run``
builds, to a batch processor whose exporter drops them. Rounds alternate
the sides, so machine noise hits all alike; medians of ``--rounds``.

    .venv/bin/python bench/effect_spans.py [--messages 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from leaseworker import Attempt, Trigger
from leaseworker._execution._completion import Completer
from leaseworker._store._effect_rows import Message, OutboxRow
from leaseworker._telemetry import Telemetry
from leaseworker._telemetry._lean import LeanTracerProvider
from leaseworker.effects import EffectEvent

TOPIC = "reports.ready"


class _Dropped(SpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class _Held:
    """The one field of a held lease ``Completer.publish`` reads."""

    fence = 7
    key = "ns:{report:acme:2026-11}"


def _completer(hooks: tuple[Any, ...]) -> Completer:
    attempt = Attempt(
        trigger=Trigger(
            topic="reports.requested",
            partition=0,
            offset=0,
            key="report:acme:2026-11",
            headers=(),
            timestamp=None,
            payload={},
        ),
        job_key="report:acme:2026-11",
        input_version="v1",
        execution_id="e" * 32,
        pod="pod-a",
    )
    return Completer(
        None,  # type: ignore[arg-type]  # publish() does not touch the store
        _Held(),  # type: ignore[arg-type]
        key=_Held.key,
        input_version="v1",
        execution_id=attempt.execution_id,
        pod="pod-a",
        attempt=attempt,
        hooks=hooks,
    )


def _publish(hooks: tuple[Any, ...], count: int) -> float:
    """Seconds per ``publish()`` of ``count`` messages, one execution each."""
    began = time.perf_counter()
    for _ in range(count):
        _completer(hooks).publish(TOPIC, {"tenant": "acme", "period": "2026-11"}, key="acme")
    return (time.perf_counter() - began) / count


def _sends(hook: Any, count: int) -> float:
    """Seconds per relay ``sent`` event turned into its span and counted."""
    trace: list[tuple[str, bytes]] = []
    hook(EffectEvent(name="published", topic=TOPIC, carrier=trace, effect_id="lw1:x:0"))
    row = OutboxRow(
        id=1,
        job_key=_Held.key,
        input_version="v1",
        seq=0,
        fence=7,
        message=Message(topic=TOPIC, value=b"{}", trace=tuple(trace)),
    )
    began = time.perf_counter()
    for offset in range(count):
        hook(
            EffectEvent(
                name="sent",
                topic=TOPIC,
                effect_id=row.effect_id,
                job_key=row.job_key,
                fence=row.fence,
                trace=row.message.trace,
                partition=0,
                offset=offset,
                began=0.0,
                relay="pod-a:1",
            )
        )
    return (time.perf_counter() - began) / count


def main() -> None:
    """Parse the flags; measure inside an event loop (as the pod's calls run)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    anyio.run(_measure, parser.parse_args())


async def _measure(args: argparse.Namespace) -> None:
    """Alternate the sides for ``--rounds`` rounds; print the medians in microseconds."""
    sdk = TracerProvider(resource=Resource.create({"service.name": "bench"}))
    provider = LeanTracerProvider(sdk.resource, sdk.sampler)
    provider.add_span_processor(BatchSpanProcessor(_Dropped()))
    pod = Telemetry(tracer_provider=provider).instrument(pod="pod-a")
    sides: dict[str, Callable[[], float]] = {
        "publish, no telemetry": lambda: _publish((), args.messages),
        "publish + publish span (execution)": lambda: _publish((pod,), args.messages),
        "relay send span (relay task)": lambda: _sends(pod, args.messages),
    }
    seen: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, side in sides.items():
            seen[name].append(side())
    base = statistics.median(seen["publish, no telemetry"])
    for name, values in seen.items():
        median = statistics.median(values)
        print(f"{name:36} {median * 1e6:7.1f} us/message  ({median / base:4.2f}x publish alone)")
    provider.shutdown()


if __name__ == "__main__":
    main()
