"""One pod's telemetry: execution, lease, Kafka source and effect events as spans and metrics.

:class:`PodTelemetry` is the hook a :class:`~leaseworker.Pod` gives its
executor, its Kafka source and its outbox relay: one CONSUMER ``process
{topic}`` trace per trigger, sampled as a whole (effects: ``_effect_spans``);
a failing step is logged, never changes the worker. See docs/design.md#pod-telemetry-and-sampling.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar, final

import anyio
from opentelemetry import context as otel_context
from opentelemetry.trace import (
    SpanKind,
    Tracer,
    set_span_in_context,
)

from .._events import Attempt, EffectEvent, Event, ExecutionEvent, LeaseEvent, SourceEvent, Trigger
from .._lease import now
from .._outcome import DeadLetterReason, MalformedReason
from . import _names as n
from ._effect_spans import EffectSpans
from ._lease_spans import ERROR_OUTCOMES, LeaseSpans, end_acquire
from ._metrics import Metrics
from ._propagation import consumer_parent
from ._span_records import end_child, recorded_parent
from ._trace import (
    CURRENT,
    Attributes,
    TriggerTrace,
    error_status,
    key_text,
    ms,
    note_acquire_event,
    wall_ns,
)

logger = logging.getLogger("leaseworker.telemetry")

P = ParamSpec("P")
R = TypeVar("R")

MAX_PENDING_COMMITS = 10_000
"""Records per partition remembered until their offset is committed (oldest dropped)."""


def _guarded(method: Callable[P, R | None]) -> Callable[P, R | None]:
    """Log and swallow a hook's exception: telemetry must never break the worker."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
        try:
            return method(*args, **kwargs)
        except Exception:
            logger.exception("telemetry hook %s failed", method.__name__)
            return None

    return wrapper


@final
class PodTelemetry:
    """Spans and metrics of one pod; build it with :meth:`Telemetry.instrument`."""

    def __init__(
        self,
        tracer: Tracer,
        metrics: Metrics,
        *,
        pod: str,
        group: str | None,
        parent_on_producer: bool,
        enabled: bool = True,
    ) -> None:
        self.enabled = enabled  # False: no providers, callers may skip the hooks
        self._tracer = tracer
        self._metrics = metrics
        self._pod = pod
        self._group = group
        self._parent_on_producer = parent_on_producer
        self._pending: dict[tuple[str, int], dict[int, TriggerTrace]] = {}
        self._leases: dict[str, LeaseSpans] = {}  # execution id -> its lease spans
        self._running: dict[str, str] = {}  # execution id -> job key
        self._per_key: dict[str, tuple[int, float]] = {}  # job key -> (running, since)
        self._effects = EffectSpans(tracer, metrics, pod=pod)

    # -- the hook ----------------------------------------------------------------------

    def __call__(self, event: Event) -> None:
        """Record one event of the executor, a held lease or the Kafka source.

        A failure here is logged by the caller's ``emit()``: telemetry never breaks
        the worker.
        """
        if isinstance(event, LeaseEvent):
            if event.attempt is not None and (
                spans := self._leases.get(event.attempt.execution_id)
            ):
                spans.on_lease_event(event)
        elif isinstance(event, ExecutionEvent):
            if event.event == "acquiring":
                self._acquiring(event.attempt)
            else:
                self.on_event(event)
        elif isinstance(event, EffectEvent):
            self._effects.on_event(event)
        else:
            self._source_event(event)

    def lease_note(self, attempt: Attempt) -> str:
        """Return the note ``attempt``'s acquisition leaves with its lease (its trace reference)."""
        spans = self._leases.get(attempt.execution_id)
        return "" if spans is None else spans.lease_note()

    def _source_event(self, event: SourceEvent) -> None:
        name = event.name
        if name == "processing":
            self._processing(event.record)
        elif name == "processed":
            self._processed(event.record, event.error)
        elif name == "received" and event.trigger is not None and event.job_key is not None:
            self.received(event.trigger, event.job_key)
        elif name == "malformed":
            self.malformed(event.record, event.reason)  # type: ignore[arg-type]
        elif name == "dead_lettered":
            self.dead_lettered(event.record, event.reason)  # type: ignore[arg-type]
        elif name == "committed" and event.offsets is not None:
            began = event.began or 0.0
            self.committed(event.offsets, began, error=event.error, rejected=event.rejected)
        elif name == "revoked" and event.topic is not None and event.partition is not None:
            self.forget(event.topic, event.partition)

    # -- Kafka source events -----------------------------------------------------------

    def _processing(self, record: Any) -> None:
        """Make ``record``'s ``process {topic}`` span current while it is processed."""
        trace = self._open(record)
        if trace is None:
            return
        trace.tokens = (otel_context.attach(trace.parent), CURRENT.set(trace))

    def _processed(self, record: Any, error: BaseException | None) -> None:
        """End what :meth:`_processing` began (in the same task): the trace of ``record``."""
        trace = CURRENT.get()
        if trace is None or trace.tokens is None:
            return  # processing opened none (its trace failed to open)
        ctx_token, var_token = trace.tokens
        trace.tokens = None
        cancelled = isinstance(error, anyio.get_cancelled_exc_class())
        if error is not None and trace.span is not None and not cancelled:
            trace.span.set_attribute(n.ERROR_TYPE, type(error).__name__)
            trace.span.set_status(error_status(type(error).__name__))
        CURRENT.reset(var_token)
        otel_context.detach(ctx_token)
        self._close(trace)

    def received(self, trigger: Trigger, job_key: str) -> None:
        """Record the ``trigger received`` span: the record decoded for ``job_key``."""
        if not self.enabled:
            return
        trace = self._trace_for(trigger)
        trace.job_key = job_key  # the process span gets it when it ends (one SDK call less)
        trace.received = True

    def malformed(self, record: Any, reason: MalformedReason) -> None:
        """Mark the record malformed: a terminal outcome (dead-lettered if configured)."""
        trace = CURRENT.get()
        if trace is None or trace.span is None:
            return
        trace.terminal = True
        trace.outcome = "malformed"
        trace.span.set_attributes({n.MALFORMED_REASON: reason, n.ERROR_TYPE: "MalformedTrigger"})
        trace.span.set_status(error_status(f"malformed trigger: {reason}"))

    def dead_lettered(self, record: Any, reason: DeadLetterReason) -> None:
        """Record that the record was copied to the dead-letter topic."""
        self._metrics.dead_letters.add(
            1, {n.DEAD_LETTER_REASON: reason, n.MESSAGING_DESTINATION: record.topic}
        )
        trace = CURRENT.get()
        if trace is not None and trace.recording:
            attributes = trace.own()
            attributes[n.DEAD_LETTER_REASON] = reason
            at = time.time_ns()
            end_child(self._tracer, trace, n.SPAN_DEAD_LETTER, attributes, at, at)

    def committed(
        self,
        offsets: Mapping[Any, int],
        began: float,
        *,
        error: BaseException | None = None,
        rejected: bool = False,
    ) -> None:
        """Record a commit of ``offsets`` (topic-partition -> next position).

        Each record it covers gets a ``commit {topic}`` span in its own trace. A
        commit that failed with ``error`` is recorded on the same spans as an
        error; its records stay pending for the retry, unless the group
        ``rejected`` it (the partitions belong to another member now).
        """
        if not self.enabled:
            return
        end = wall_ns()
        for tp, position in offsets.items():
            pending = self._pending.get((tp.topic, tp.partition), {})
            covered = sorted(offset for offset in pending if offset < position)
            for offset in covered:
                if pending[offset].recording:
                    self._commit_span(pending[offset], position, began, end, error)
                if error is None:
                    del pending[offset]
            if error is None and covered:
                self._metrics.committed.add(len(covered), {n.MESSAGING_DESTINATION: tp.topic})
            if rejected:
                self.forget(tp.topic, tp.partition)

    def forget(self, topic: str, partition: int) -> None:
        """Drop what is pending commit on a partition this pod no longer owns."""
        self._pending.pop((topic, partition), None)

    # -- executor and lease events -----------------------------------------------------

    def _acquiring(self, attempt: Attempt) -> None:
        """Start the lease spans of a new execution (its acquire span starts now)."""
        trace = self._trace_for(attempt.trigger)
        if trace.job_key is None:
            trace.job_key = attempt.job_key
        execution_id = attempt.execution_id
        self._received_span(trace, execution_id)
        if not trace.acquiring:  # the first try: the ``lease acquire`` span starts now
            trace.acquiring = True
            trace.acquire_execution_id = execution_id
            if trace.recording:
                trace.acquire_began = now()
                trace.acquire_started_ns = time.time_ns()
        self._leases[execution_id] = LeaseSpans(self._tracer, self._metrics, trace, execution_id)

    def on_event(self, event: ExecutionEvent) -> None:
        """Record one execution event (started, finished, retry, or a newer kind)."""
        trace = self._trace_for(event.trigger)
        if event.event == "finished":
            self._leases.pop(event.execution_id, None)
        if event.event == "started":
            self._started(trace, event)
        elif event.event == "finished":
            self._finished(trace, event)
        elif event.event == "retry":
            retry_in: Attributes = {n.RETRY_IN_MS: ms(event.retry_in or 0.0)}
            if trace.acquiring:
                note_acquire_event(trace, "retry", retry_in)
            elif trace.span is not None:
                trace.span.add_event("retry", retry_in)
        else:
            self._other(trace, event)

    def _started(self, trace: TriggerTrace, event: ExecutionEvent) -> None:
        trace.execution_id, trace.fence = event.execution_id, event.fence
        self._metrics.in_flight.add(1)
        self._running[event.execution_id] = event.job_key
        self._count_key(event.job_key, +1)
        if trace.recording:
            trace.run_started_ns = time.time_ns()  # ``job run`` is made when it ends

    def _finished(self, trace: TriggerTrace, event: ExecutionEvent) -> None:
        outcome = event.outcome or "unknown"
        self._metrics.outcomes.add(1, {n.OUTCOME: outcome})
        self._metrics.duration.record(event.elapsed, {n.OUTCOME: outcome})
        trace.outcome = outcome
        trace.execution_id = event.execution_id
        if event.fence is not None:
            trace.fence = event.fence
        trace.terminal = event.terminal  # ``lost`` as ``stale`` too: the offset is committed
        if event.cpu_seconds is not None:  # its run_in_process children's CPU, kept or wasted
            labels: Attributes = {n.OUTCOME: outcome, n.REASON: event.reason or ""}
            self._metrics.cpu.add(event.cpu_seconds, labels)
        if event.reason == "lost_repeatedly":  # the loss budget is spent: given up
            loss = getattr(event.error, "reason", None)
            self._metrics.lost_repeatedly.add(1, {n.LOSS_REASON: str(loss or "unknown")})
        job_key = self._running.pop(event.execution_id, None)
        if job_key is None:  # never acquired: busy, or Redis did not answer
            if trace.acquiring:
                trace.busy += outcome == "busy"
                attributes: Attributes = {n.EXECUTION_ID: event.execution_id, n.OUTCOME: outcome}
                note_acquire_event(trace, outcome, attributes)
        else:
            self._metrics.in_flight.add(-1)
            self._count_key(job_key, -1)
        if trace.run_started_ns is not None:
            self._run_span(trace, outcome, event.error, event)
        if trace.terminal and trace.span is None:
            self._close(trace)  # no Kafka source: the trace ends with the execution
            CURRENT.set(None)

    def _other(self, trace: TriggerTrace, event: ExecutionEvent) -> None:
        """Events this version does not know by name (a completion step, say) become spans."""
        status = event.reason if event.event == "completion" else None
        if status is not None:
            # The store's answer: accepted, duplicate or stale. A stale answer is the
            # destination proving this execution had lost ownership: count it as a loss.
            self._metrics.completions.add(1, {n.COMPLETION_STATUS: status})
            if status == "stale":
                self._metrics.losses.add(1, {n.LOSS_REASON: "stale"})
        if not trace.recording:
            return
        attributes = trace.own(execution_id=event.execution_id, fence=event.fence)
        if event.outcome is not None:
            attributes[n.OUTCOME] = event.outcome
        if status is not None:
            attributes[n.COMPLETION_STATUS] = status
        # A completion is reported after the release (a paused pod may send it long
        # after the store decided): placed when the answer came, as in the history.
        end = wall_ns(event.answered_at)
        name = event.event.replace("_", " ")
        end_child(self._tracer, trace, name, attributes, end - int(event.elapsed * 1e9), end)

    # -- helpers -----------------------------------------------------------------------

    def _open(self, record: Any) -> TriggerTrace | None:
        try:
            parent, links = consumer_parent(
                record.headers, parent_on_producer=self._parent_on_producer
            )
            trace = TriggerTrace(
                topic=record.topic,
                partition=record.partition,
                offset=record.offset,
                key=key_text(record.key),
                group=self._group,
                pod=self._pod,
                parent=parent,
            )
            attributes = trace.attributes()
            attributes[n.MESSAGING_BODY_SIZE] = len(record.value or b"")
            trace.span = self._tracer.start_span(
                n.process_span_name(record.topic),
                context=parent,
                kind=SpanKind.CONSUMER,
                attributes=attributes,
                links=links,
                start_time=trace.started_ns,
            )
            trace.parent = set_span_in_context(trace.span)
            trace.recording = trace.span.is_recording()
            trace.recorded_parent = recorded_parent(trace.span)
            self._metrics.received.add(1, {n.MESSAGING_DESTINATION: record.topic})
        except Exception:
            logger.exception("telemetry could not open the trace of a record")
            return None
        return trace

    def _received_span(self, trace: TriggerTrace, execution_id: str | None) -> None:
        """End ``trigger received``: from the record's arrival to its first execution.

        It is emitted when the first execution begins (so it carries that
        execution's id and shows how long the trigger waited, e.g. behind
        another execution of its job key in this pod), or when processing ends.
        """
        if not trace.received:
            return
        trace.received = False
        if not trace.recording:
            return
        attributes = trace.own(execution_id=execution_id)
        end_child(
            self._tracer, trace, n.SPAN_RECEIVED, attributes, trace.started_ns, time.time_ns()
        )

    @_guarded
    def _close(self, trace: TriggerTrace) -> None:
        self._received_span(trace, None)
        if trace.acquiring:  # cancelled (or gave up) while waiting for the lease
            outcome = trace.outcome or "cancelled"
            end_acquire(self._tracer, trace, {n.OUTCOME: outcome}, time.time_ns(), outcome)
        if trace.run_started_ns is not None:
            self._run_span(trace, "cancelled", None)
        if trace.span is not None:
            if trace.recording:
                # The Kafka coordinates were set at the start; add what was learnt since
                # (re-setting all of them cost as much SDK validation as another span).
                identity = trace.identity()
                identity[n.OUTCOME] = trace.outcome or "cancelled"
                trace.span.set_attributes(identity)
                if trace.outcome in ERROR_OUTCOMES and trace.outcome != "lost":
                    trace.span.set_status(error_status(trace.outcome or ""))
            trace.span.end()
            if trace.terminal:
                self._remember(trace)

    def _remember(self, trace: TriggerTrace) -> None:
        pending = self._pending.setdefault((trace.topic, trace.partition), {})
        pending[trace.offset] = trace
        while len(pending) > MAX_PENDING_COMMITS:
            del pending[next(iter(pending))]

    def _commit_span(
        self,
        trace: TriggerTrace,
        position: int,
        began: float,
        end: int,
        error: BaseException | None,
    ) -> None:
        attributes = trace.attributes()
        attributes[n.MESSAGING_OPERATION_NAME] = "commit"
        attributes[n.MESSAGING_OPERATION_TYPE] = "settle"
        attributes[n.COMMIT_POSITION] = position
        status = None
        if error is not None:
            attributes[n.ERROR_TYPE] = type(error).__name__
            status = error_status(type(error).__name__)
        name = n.commit_span_name(trace.topic)  # a child of the (ended) process span
        end_child(
            self._tracer,
            trace,
            name,
            attributes,
            wall_ns(began),
            end,
            kind=SpanKind.CLIENT,
            status=status,
            shared=False,  # its operation name and type are its own
        )

    def _run_span(
        self,
        trace: TriggerTrace,
        outcome: str,
        error: BaseException | None,
        finished: ExecutionEvent | None = None,
    ) -> None:
        """Make the ``job run`` span, from the start of the job to now, in one SDK call.

        All its attributes, the outcome included, are there when it starts;
        ``finished`` adds what the execution's child processes cost.
        """
        if not trace.recording:
            trace.run_started_ns = None
            return
        attributes = trace.own()
        attributes[n.OUTCOME] = outcome
        if error is not None:
            attributes[n.ERROR_TYPE] = type(error).__name__
        if finished is not None and finished.cpu_seconds is not None:
            attributes[n.CPU_SECONDS] = round(finished.cpu_seconds, 6)
            attributes[n.PEAK_MEMORY] = finished.peak_memory or 0
        start, trace.run_started_ns = trace.run_started_ns or 0, None
        status = error_status(outcome) if outcome in ERROR_OUTCOMES else None
        end_child(self._tracer, trace, n.SPAN_RUN, attributes, start, time.time_ns(), status=status)

    def _trace_for(self, trigger: Trigger) -> TriggerTrace:
        """Return the current trigger's trace, or start a span-less one (no Kafka source)."""
        trace = CURRENT.get()
        if trace is not None and (trace.topic, trace.partition, trace.offset) == (
            trigger.topic,
            trigger.partition,
            trigger.offset,
        ):
            return trace
        trace = TriggerTrace(
            topic=trigger.topic,
            partition=trigger.partition,
            offset=trigger.offset,
            key=trigger.key,
            group=self._group,
            pod=self._pod,
            parent=otel_context.get_current(),
        )
        CURRENT.set(trace)
        return trace

    def _count_key(self, job_key: str, delta: int) -> None:
        """Track executions per job key in this pod; time with more than one is overlap."""
        moment = time.monotonic()
        running, since = self._per_key.get(job_key, (0, moment))
        if running > 1:
            self._metrics.overlap.add(moment - since)
        running += delta
        if running <= 0:
            self._per_key.pop(job_key, None)
        else:
            self._per_key[job_key] = (running, moment)
