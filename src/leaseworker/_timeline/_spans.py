"""Traces to a history: leaseworker's lifecycle spans become executions and their steps.

A pod's spans carry the job key, execution id, pod and fence (docs/telemetry.md),
so spans are grouped by ``leaseworker.execution.id`` into one
:class:`~leaseworker._history.Execution` each. An execution starts when its
``lease acquire`` span ends (the lease is held); it ends when it stopped
holding it: for a lost execution when its body stopped (``job stopped``;
the release that may follow is cleanup, drawn apart), otherwise when its
``lease release`` was answered. The trigger's ``process {topic}`` span gives
the Kafka coordinates and the trace reference; ``commit {topic}`` the commit.
A ``publish {topic}`` span names an effect of its execution (committed with
an accepted completion); the relay's ``send {topic}`` span, its child, says
when the broker had it: both become steps of that execution.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from .._history import Execution, History, Scalar, Step
from .._telemetry import names as n

_PROCESS = "process "
_COMMIT = "commit "
_PUBLISH = "publish "


@dataclass(frozen=True, slots=True, kw_only=True)
class Span:
    """One span as a trace store returned it: ids in lowercase hex, times in Unix seconds."""

    trace_id: str
    span_id: str
    name: str
    start: float
    end: float
    attributes: Mapping[str, Scalar] = field(default_factory=dict)
    parent_span_id: str | None = None
    links: tuple[tuple[str, str], ...] = ()  # (trace id, span id)
    error: bool = False
    service: str = ""


def history_from_spans(spans: Iterable[Span], job_key: str | None = None) -> History:
    """Build the history of ``job_key`` (every key when ``None``) from its traces' spans."""
    by_execution: dict[str, list[Span]] = {}
    process: dict[str, Span] = {}
    published: dict[str, str] = {}  # publish span id -> its execution
    relayed: list[Span] = []
    for span in spans:
        if span.name.startswith(_PROCESS):
            process[span.trace_id] = span
        elif (execution_id := _execution_of(span, job_key)) is not None:
            by_execution.setdefault(execution_id, []).append(span)
            if span.name.startswith(_PUBLISH):
                published[span.span_id] = execution_id
        elif n.EFFECT_ID in span.attributes:
            relayed.append(span)  # the relay's send: child of and linked to the publish span
    for span in relayed:
        # Jaeger's classic answer keeps a link to one's own parent as the one reference.
        found = (published.get(s) for s in (span.parent_span_id, *(s for _, s in span.links)) if s)
        if (execution_id := next((e for e in found if e is not None), None)) is not None:
            by_execution[execution_id].append(span)
    for span in process.values():  # answered without an execution span: from the store
        if (execution_id := _execution_of(span, job_key)) is not None:
            by_execution.setdefault(execution_id, [span])
    executions = [
        _execution(execution_id, group, process.get(group[0].trace_id))
        for execution_id, group in by_execution.items()
        if any(_step(s) is not None or s.name.startswith(_PROCESS) for s in group)
    ]  # (an attempt that found the lease busy left only its ``trigger received``)
    executions.sort(key=lambda e: (e.start, e.execution_id))
    return History(clock="unix", executions=tuple(executions))


def _execution_of(span: Span, job_key: str | None) -> str | None:
    """Return the execution id ``span`` belongs to, if it has one and is of ``job_key``."""
    execution_id = span.attributes.get(n.EXECUTION_ID)
    if execution_id is None or (job_key is not None and span.attributes.get(n.JOB_KEY) != job_key):
        return None
    return str(execution_id)


def _execution(execution_id: str, spans: list[Span], process: Span | None) -> Execution:
    spans = sorted(spans, key=lambda s: (s.start, s.end))
    first = spans[0]
    attrs = first.attributes
    steps = [step for step in map(_step, spans) if step is not None]
    outcome = _text(process.attributes.get(n.OUTCOME)) if process is not None else None
    runs = [s for s in spans if s.name == n.SPAN_RUN]
    cpu: float | None = None
    if runs:
        outcome = _text(runs[-1].attributes.get(n.OUTCOME)) or outcome
        spent = runs[-1].attributes.get(n.CPU_SECONDS)
        cpu = float(spent) if isinstance(spent, int | float) else None
    named = {step.name: step for step in steps}  # the last of each name
    acquired = named.get("acquired")
    end = _end(named, spans)
    if acquired is not None:
        start = acquired.at
    else:  # never held the lease: answered from the store before acquiring
        start = end = max(s.end for s in spans)
        if outcome == "duplicate":
            named["completion"] = Step(at=end, name="completion", attrs={"status": "duplicate"})
            steps.append(named["completion"])
    steps += _committed(spans, named.get("completion"))
    fences = [f for f in (_int(s.attributes.get(n.FENCE)) for s in spans) if f is not None]
    reference = process or first
    return Execution(
        job_key=str(attrs.get(n.JOB_KEY, "")),
        execution_id=execution_id,
        pod=str(attrs.get(n.POD) or attrs.get(n.SERVICE_INSTANCE_ID) or first.service),
        start=start,
        end=end,
        fence=max(fences, default=None),
        outcome=outcome,
        reason=_attr(named, "lost", "reason"),
        completion=_attr(named, "completion", "status"),
        topic=_text(attrs.get(n.MESSAGING_DESTINATION)),
        partition=_int(attrs.get(n.MESSAGING_PARTITION)),
        offset=_int(attrs.get(n.MESSAGING_OFFSET)),
        trace_id=reference.trace_id,
        span_id=reference.span_id,
        steps=tuple(steps),
        previous_execution_id=_attr(named, "acquired", "previous_execution_id"),
        cpu_seconds=cpu,
    )


def _committed(spans: list[Span], completion: Step | None) -> list[Step]:
    """Return an ``effect_committed`` step per message published, if the completion was accepted.

    The messages commit in the completion's transaction: at its answer.
    """
    if completion is None or completion.attrs.get("status") != "accepted":
        return []
    return [
        Step(
            at=completion.at,
            name="effect_committed",
            attrs={
                **_pick(s.attributes, effect_id=n.EFFECT_ID, topic=n.MESSAGING_DESTINATION),
                "span": f"{s.name} {s.span_id}",
                "trace": s.trace_id,
            },
        )
        for s in spans
        if s.name.startswith(_PUBLISH)
    ]


def _attr(named: dict[str, Step], step: str, name: str) -> str | None:
    return _text(named[step].attrs.get(name)) if step in named else None


def _end(named: dict[str, Step], spans: list[Span]) -> float | None:
    """Return when the execution stopped holding the lease (see the module docstring)."""
    if "stopped" in named:
        return named["stopped"].at
    for name in ("released", "release_failed"):
        if name in named:
            return named[name].at + named[name].duration
    runs = [s.end for s in spans if s.name == n.SPAN_RUN]
    return max(runs, default=None)


def _step(span: Span) -> Step | None:
    """Return the history step a span stands for (``None`` for spans that are not steps).

    Its ``attrs`` are the step's details under short names (``reason``,
    ``status``...), then the span's own attributes under their names and its
    ids: what the page shows on hover.
    """
    if span.name.startswith(_COMMIT):
        step: Step | None = Step(
            at=span.end, name="committed", attrs=_pick(span.attributes, position=n.COMMIT_POSITION)
        )
    elif n.EFFECT_ID in span.attributes and not span.name.startswith(_PUBLISH):
        step = Step(
            at=span.end,
            name="effect_failed" if span.error else "effect_sent",
            attrs=_pick(
                span.attributes,
                effect_id=n.EFFECT_ID,
                topic=n.MESSAGING_DESTINATION,
                partition=n.MESSAGING_PARTITION,
                offset=n.MESSAGING_OFFSET,
                error=n.ERROR_TYPE,
            ),
        )
    else:
        make = _STEPS.get(span.name)
        step = make(span) if make is not None else None
    if step is None:
        return None
    ids = {"span": f"{span.name} {span.span_id}", "trace": span.trace_id}
    return replace(step, attrs={**step.attrs, **span.attributes, **ids})


def _acquired(span: Span) -> Step | None:
    a = span.attributes
    if a.get(n.OUTCOME) != "acquired":  # the wait ended without the lease
        return None
    attrs = _pick(
        a,
        fence=n.FENCE,
        wait_ms=n.WAIT_MS,
        busy_retries=n.BUSY_RETRIES,
        previous_execution_id=n.PREVIOUS_EXECUTION_ID,
    )
    return Step(at=span.end, name="acquired", attrs=attrs)


def _renewal(span: Span) -> Step:
    verdict = str(span.attributes.get(n.RENEWAL_OUTCOME, "renewed"))
    if verdict == "renewed":
        return Step(at=span.start, name="renewed", duration=_took(span))
    return Step(at=span.start, name="renew_failed", duration=_took(span), attrs={"reason": verdict})


def _release(span: Span) -> Step:
    name = "release_failed" if span.error else "released"
    attrs = _pick(span.attributes, deleted=n.RELEASE_DELETED, error=n.ERROR_TYPE)
    return Step(at=span.start, name=name, duration=_took(span), attrs=attrs)


def _point(name: str, *, at_end: bool = False, **attrs: str) -> Callable[[Span], Step]:
    def make(span: Span) -> Step:
        return Step(
            at=span.end if at_end else span.start, name=name, attrs=_pick(span.attributes, **attrs)
        )

    return make


def _stopped(span: Span) -> Step:
    """Return the moment the body stopped (its span runs from the loss to then)."""
    return Step(
        at=span.end, name="stopped", attrs=_pick(span.attributes, latency_ms=n.STOP_LATENCY_MS)
    )


_STEPS: dict[str, Callable[[Span], Step | None]] = {
    n.SPAN_ACQUIRE: _acquired,
    n.SPAN_RENEW: _renewal,
    n.SPAN_LOST: _point("lost", reason=n.LOSS_REASON),
    n.SPAN_CANCEL: _point("cancel_requested", reason=n.LOSS_REASON),
    n.SPAN_STOPPED: _stopped,
    n.SPAN_RELEASE: _release,
    "completion": _point("completion", at_end=True, status=n.COMPLETION_STATUS),
    n.SPAN_DEAD_LETTER: _point("dead_lettered", reason=n.DEAD_LETTER_REASON),
}
"""Span name -> its step (``commit {topic}`` is matched by prefix)."""


def _took(span: Span) -> float:
    return max(0.0, span.end - span.start)


def _pick(attributes: Mapping[str, Scalar], **names: str) -> dict[str, Scalar]:
    return {short: attributes[long] for short, long in names.items() if long in attributes}


def _text(value: Scalar | None) -> str | None:
    return None if value is None else str(value)


def _int(value: Scalar | None) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except ValueError:
        return None
