"""A lean tracer provider for the spans leaseworker makes itself.

It keeps what the SDK decides (sampler, ids, resource, limits, processors,
exporters) and replaces only the span object, whose CPU cost dominates a pod
with short jobs. For a provider leaseworker owns: spans live on the event loop
and have no per-span lock. See docs/design.md#lean-tracer-provider.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, cast, final

from opentelemetry import trace as trace_api
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, SpanLimits, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, Sampler
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)
from opentelemetry.util import types

from . import _export_seam

if TYPE_CHECKING:
    from ._span_records import RecordTaker

logger = logging.getLogger("leaseworker.telemetry")

_SCALARS = frozenset({str, bool, int, float})

MAX_REMEMBERED_PARENTS = 256
"""Parent contexts a tracer remembers (more than a pod's triggers in flight)."""

_NO_OP_STARTS = frozenset({SpanProcessor.on_start, BatchSpanProcessor.on_start})
"""``on_start`` methods that do nothing: a span's start does not call them."""

_ROOT = TraceFlags(TraceFlags.SAMPLED)
_ROOT_RANDOM = TraceFlags(TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID)
"""A sampled root's flags, by whether its trace id is random (as the SDK's tracer sets them)."""

_UNSET = Status(StatusCode.UNSET)
_EMPTY: Mapping[str, types.AttributeValue] = MappingProxyType({})


@final
class LeanTracerProvider(trace_api.TracerProvider):
    """Makes :class:`LeanSpan` s and hands the ended ones to the SDK's span processors.

    ``sampler``, ``id_generator`` and ``limits`` default as in the SDK's
    ``TracerProvider`` (from ``OTEL_TRACES_SAMPLER``, ``OTEL_SPAN_*_LIMIT``...):
    pass the SDK provider's ``sampler`` to share its decision.
    """

    def __init__(
        self,
        resource: Resource,
        sampler: Sampler,
        *,
        id_generator: IdGenerator | None = None,
        limits: SpanLimits | None = None,
    ) -> None:
        self.resource = resource
        self.sampler = sampler
        self.id_generator = id_generator or RandomIdGenerator()
        self.limits = limits or SpanLimits()
        self._processors: tuple[SpanProcessor, ...] = ()
        self._starters: tuple[SpanProcessor, ...] = ()  # those whose on_start does something
        self.takes_records = False  # every processor takes span records (see ``_span_records``)
        self.record_takers: tuple[RecordTaker, ...] = ()  # they, when they all do
        # ParentBased with ALWAYS_ON for a sampled local parent (the SDK default, and
        # parentbased_traceidratio): a child of a sampled span in this process is
        # recorded and sampled with its parent's trace state, no call needed.
        # With ALWAYS_ON for roots too (the SDK default), a root is sampled, no call needed.
        described = ""
        if type(sampler) is ParentBased:
            described = sampler.get_description()  # type: ignore[no-untyped-call]
        self.children_follow = ",localParentSampled:AlwaysOnSampler," in described
        self.roots_sampled = described.startswith("ParentBased{root:AlwaysOnSampler,")

    def add_span_processor(self, processor: SpanProcessor) -> None:
        """Hand every span to ``processor`` as well (at its start and its end)."""
        self._processors = (*self._processors, processor)
        if type(processor).on_start not in _NO_OP_STARTS:
            self._starters = (*self._starters, processor)
        from ._span_records import fit  # here: ``_span_records`` imports this module

        self.takes_records = fit(self.limits) and all(
            getattr(each, "takes_records", False) for each in self._processors
        )
        self.record_takers = (
            cast("tuple[RecordTaker, ...]", self._processors) if self.takes_records else ()
        )

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: types.Attributes | None = None,
    ) -> LeanTracer:
        """Return a tracer whose spans carry this instrumentation scope."""
        scope = InstrumentationScope(
            instrumenting_module_name, instrumenting_library_version, schema_url, attributes
        )
        return LeanTracer(self, scope)

    @property
    def processors(self) -> tuple[SpanProcessor, ...]:
        """The span processors, in the order they were added."""
        return self._processors

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Flush every processor within ``timeout_millis`` in all; True if all flushed."""
        deadline = time.monotonic() + timeout_millis / 1000
        flushed = True
        for processor in self._processors:
            left = max(0, int((deadline - time.monotonic()) * 1000))
            flushed = processor.force_flush(left) and flushed
        return flushed

    def shutdown(self) -> None:
        """Shut every processor down (each flushes what it holds first)."""
        for processor in self._processors:
            processor.shutdown()


@final
class LeanTracer(trace_api.Tracer):
    """The tracer of one instrumentation scope; see :class:`LeanTracerProvider`."""

    def __init__(self, provider: LeanTracerProvider, scope: InstrumentationScope) -> None:
        self.provider = provider
        self.scope = scope
        self.origin = (provider.resource, scope)  # a span record's resource and scope
        # Explicit parent contexts seen lately, by id, with the span context each
        # holds: a trigger's lifecycle spans all start from the same context
        # object, and a Context never changes, so the API's lookup (three calls)
        # is made once per trigger. The entry keeps its context, so an id reused
        # by a new object cannot match.
        self._parents: dict[int, tuple[Context, SpanContext]] = {}

    def start_span(
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: types.Attributes = None,
        links: Sequence[Link] | None = (),
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace_api.Span:
        """Start a span, decided and identified exactly as the SDK's tracer would."""
        provider = self.provider
        links = links or ()
        known = self._parents.get(id(context)) if context is not None else None
        if known is not None and known[0] is context:  # a sibling's parent
            parent_context = known[1]
        else:
            parent_context = trace_api.get_current_span(context).get_span_context()
            if context is not None:
                if len(self._parents) >= MAX_REMEMBERED_PARENTS:
                    self._parents.clear()
                self._parents[id(context)] = (context, parent_context)
        trace_id, _, remote, flags, trace_state, valid = _export_seam.fields(parent_context)
        parent = parent_context if valid else None
        if (
            provider.children_follow and flags & TraceFlags.SAMPLED and not remote and valid
        ):  # what the sampler would answer, without asking it
            decision = Decision.RECORD_AND_SAMPLE
            state: TraceState | None = trace_state
        elif provider.roots_sampled and not valid:  # a root, sampled: the sampler's answer
            trace_id = provider.id_generator.generate_trace_id()
            decision, state = Decision.RECORD_AND_SAMPLE, None
            flags = _ROOT_RANDOM if provider.id_generator.is_trace_id_random() else _ROOT
        else:
            if parent is None:
                trace_id = provider.id_generator.generate_trace_id()
                random_trace_id = provider.id_generator.is_trace_id_random()
            else:
                random_trace_id = flags.random_trace_id
            sampling = provider.sampler.should_sample(
                context, trace_id, name, kind, attributes, links
            )
            decision, state = sampling.decision, sampling.trace_state
            attributes = sampling.attributes
            sampled = decision is Decision.RECORD_AND_SAMPLE
            flags = TraceFlags(
                (TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
                | (TraceFlags.RANDOM_TRACE_ID if random_trace_id else 0)
            )
        span_context = SpanContext(
            trace_id,
            provider.id_generator.generate_span_id(),
            is_remote=False,
            trace_flags=flags,
            trace_state=state,
        )
        if decision is Decision.DROP:
            return trace_api.NonRecordingSpan(span_context)
        span = LeanSpan(
            name,
            span_context,
            parent,
            kind,
            attributes,
            links,
            start_time if start_time is not None else time.time_ns(),
            provider,
            self.scope,
            record_exception=record_exception,
            set_status_on_exception=set_status_on_exception,
        )
        for processor in provider._starters:
            processor.on_start(span, context)  # type: ignore[arg-type]  # duck-typed span
        return span

    @contextmanager  # the API's own decorator is private; the result works the same
    def start_as_current_span(  # type: ignore[override]
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: types.Attributes = None,
        links: Sequence[Link] | None = (),
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> Iterator[trace_api.Span]:
        """Start a span and make it current for the ``with`` block.

        As the SDK's, except that an exception escaping the block is recorded
        by type only (see :meth:`LeanSpan.record_exception`), in the event and
        in the ERROR status alike.
        """
        span = self.start_span(
            name,
            context,
            kind,
            attributes,
            links,
            start_time,
            record_exception,
            set_status_on_exception,
        )
        with trace_api.use_span(
            span, end_on_exit=end_on_exit, record_exception=False, set_status_on_exception=False
        ) as current:
            try:
                yield current
            except Exception as exc:
                if current.is_recording():
                    if record_exception:
                        current.record_exception(exc, escaped=True)
                    if set_status_on_exception:
                        current.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                raise


class LeanSpan(trace_api.Span):
    """A recording span that is also its own ``ReadableSpan`` once ended.

    It has the ``ReadableSpan`` attributes exporters read (``name``,
    ``context``, ``parent``, ``kind``, ``attributes``, ``events``, ``links``,
    ``status``, ``start_time``, ``end_time``, ``resource``,
    ``instrumentation_scope``, the ``dropped_*`` counts), so the SDK's batch
    processor and the OTLP exporters take it as it is.
    """

    __slots__ = (
        "_attributes",
        "_record_exception",
        "_set_status_on_exception",
        "attributes",
        "context",
        "dropped_attributes",
        "dropped_events",
        "dropped_links",
        "end_time",
        "events",
        "instrumentation_scope",
        "kind",
        "links",
        "name",
        "parent",
        "provider",
        "resource",
        "start_time",
        "status",
    )

    def __init__(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        attributes: types.Attributes,
        links: Sequence[Link],
        start_time: int,
        provider: LeanTracerProvider,
        scope: InstrumentationScope,
        *,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> None:
        self.name = name
        self.context = context
        self.parent = parent
        self.kind = kind
        self.start_time: int | None = start_time
        self.end_time: int | None = None
        self.status = _UNSET
        self.instrumentation_scope = scope
        self.provider = provider  # the one that made it: its limits and processors
        self._record_exception = record_exception
        self._set_status_on_exception = set_status_on_exception
        self.resource: Resource = provider.resource
        self.events: tuple[Event, ...] = ()
        self.dropped_events = 0
        limits = provider.limits
        self._attributes: dict[str, types.AttributeValue] = {}
        self.attributes: Mapping[str, types.AttributeValue] = _EMPTY  # read-only view
        self.dropped_attributes = 0
        if attributes:
            self._attributes, self.dropped_attributes = _checked(
                attributes, limits.max_span_attributes, limits.max_span_attribute_length
            )
            self.attributes = MappingProxyType(self._attributes)
        kept = len(links) if limits.max_links is None else min(len(links), limits.max_links)
        self.links = tuple(links[len(links) - kept :]) if kept else ()  # the newest, as the SDK
        self.dropped_links = len(links) - kept

    # -- the Span API --------------------------------------------------------------------
    # (The ReadableSpan view's ``resource``, ``attributes`` (read-only) and ``events``
    # are plain slots, kept current by these methods: exporters read them without a
    # property call.)

    def get_span_context(self) -> SpanContext:
        """Return the span's context (ids, flags, trace state)."""
        return self.context

    def is_recording(self) -> bool:
        """Return True until the span ends."""
        return self.end_time is None

    def set_attributes(self, attributes: Mapping[str, types.AttributeValue]) -> None:
        """Add or replace attributes (ignored once the span ended)."""
        if self.end_time is not None:
            logger.debug("setting attributes on an ended span %r", self.name)
            return
        merged = {**self._attributes, **attributes}
        limits = self.provider.limits
        self._attributes, dropped = _checked(
            merged, limits.max_span_attributes, limits.max_span_attribute_length
        )
        self.attributes = MappingProxyType(self._attributes)
        self.dropped_attributes += dropped

    def set_attribute(self, key: str, value: types.AttributeValue) -> None:
        """Add or replace one attribute (ignored once the span ended)."""
        self.set_attributes({key: value})

    def add_event(
        self, name: str, attributes: types.Attributes = None, timestamp: int | None = None
    ) -> None:
        """Add an event (beyond the event limit the oldest is dropped and counted)."""
        if self.end_time is not None:
            return
        limits = self.provider.limits
        kept = self.events
        if limits.max_events is not None and len(kept) >= limits.max_events:
            self.dropped_events += 1  # the SDK keeps the newest: the oldest goes
            if not kept:
                return
            kept = kept[1:]
        checked = None
        if attributes:
            checked, _ = _checked(
                attributes, limits.max_event_attributes, limits.max_span_attribute_length
            )
        event = Event(name, checked, timestamp if timestamp is not None else time.time_ns())
        self.events = (*kept, event)  # events are few: a new tuple each is cheap

    def add_link(self, context: SpanContext, attributes: types.Attributes = None) -> None:
        """Add a link after the start (beyond the link limit the oldest is dropped and counted)."""
        if self.end_time is not None or not context.is_valid:
            return
        limits = self.provider.limits
        links = (*self.links, Link(context, attributes))
        if limits.max_links is not None and len(links) > limits.max_links:
            self.dropped_links += len(links) - limits.max_links  # the oldest go, as in the SDK
            links = links[len(links) - limits.max_links :]
        self.links = links

    def update_name(self, name: str) -> None:
        """Rename the span (ignored once it ended)."""
        if self.end_time is None:
            self.name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        """Set the status with the SDK's rules: OK is final, UNSET never overrides."""
        if self.end_time is not None or self.status.status_code is StatusCode.OK:
            return
        if not isinstance(status, Status):
            status = Status(status, description)
        if status.status_code is not StatusCode.UNSET:
            self.status = status

    def record_exception(
        self,
        exception: BaseException,
        attributes: types.Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        """Record an ``exception`` event: its type and where it was raised.

        Unlike the SDK, the message is left out: exception messages may quote
        payload data, which leaseworker never puts in spans (the frames are kept).
        """
        kind = type(exception)
        module = kind.__module__
        event: dict[str, types.AttributeValue] = {
            "exception.type": f"{module}.{kind.__qualname__}"
            if module and module != "builtins"
            else kind.__qualname__,
            "exception.stacktrace": "".join(traceback.format_tb(exception.__traceback__)),
            "exception.escaped": str(escaped),
        }
        if attributes:
            event.update(attributes)
        self.add_event("exception", event, timestamp)

    def end(self, end_time: int | None = None) -> None:
        """End the span and hand it to the processors (a second call does nothing)."""
        if self.end_time is not None:
            return
        self.end_time = end_time if end_time is not None else time.time_ns()
        for processor in self.provider._processors:
            processor.on_end(self)  # type: ignore[arg-type]  # the ReadableSpan view

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        """End the span; an exception from the block is recorded first, as configured."""
        if isinstance(exc_val, Exception) and self.is_recording():
            if self._record_exception:
                self.record_exception(exc_val, escaped=True)
            if self._set_status_on_exception:
                self.set_status(Status(StatusCode.ERROR, f"{type(exc_val).__name__}"))
        super().__exit__(exc_type, exc_val, exc_tb)

    def __repr__(self) -> str:
        return f"LeanSpan(name={self.name!r}, context={self.context!r})"


def _checked(
    attributes: Mapping[str, types.AttributeValue] | Any,
    max_count: int | None,
    max_length: int | None,
) -> tuple[dict[str, types.AttributeValue], int]:
    """Return ``attributes`` as the SDK would keep them, and how many were dropped.

    The common case (a few scalar values, no length limit) is a plain copy.
    """
    if (
        max_length is None
        and (max_count is None or len(attributes) <= max_count)
        and _SCALARS.issuperset(map(type, attributes.values()))
    ):
        return dict(attributes), 0
    bounded = BoundedAttributes(max_count, attributes, immutable=False, max_value_len=max_length)
    return dict(bounded), bounded.dropped
