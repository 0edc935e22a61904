"""One trigger's trace: the process span, its attributes, and what happened so far.

A :class:`TriggerTrace` lives as long as its trigger is processed. The Kafka
source makes it current (a context variable) in the task that processes the
record; the executor's callbacks run in that task, and the lease's renewal
task inherits it, so every lifecycle event finds its trace without a lookup
table. Times: lease events carry monotonic timestamps, spans want wall-clock
nanoseconds; :func:`wall_ns` converts.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from .._lease import now as monotonic_now
from . import _names as n
from ._export_seam import Fields

Attributes = dict[str, AttributeValue]


@dataclass(eq=False, slots=True, kw_only=True)
class TriggerTrace:
    """What telemetry knows about one trigger being processed."""

    topic: str
    partition: int
    offset: int
    key: str | None
    group: str | None
    pod: str
    parent: Context
    span: Span | None = None
    recorded_parent: Fields | None = None  # the span's context, if its children may be records
    recording: bool = True  # False: the process span was sampled out, and with it its children
    started_ns: int = field(default_factory=time.time_ns)
    job_key: str | None = None
    received: bool = False  # decoded; its ``trigger received`` span is still to be sent
    execution_id: str | None = None
    fence: int | None = None
    acquiring: bool = False  # an acquire is under way; its span is made when it ends
    acquire_began: float = 0.0  # monotonic
    acquire_started_ns: int = 0
    acquire_execution_id: str | None = None  # the first execution that tried
    acquire_events: list[tuple[str, Attributes, int]] = field(default_factory=list)
    busy: int = 0
    run_started_ns: int | None = None  # the job runs; its span is made when it ends
    outcome: str | None = None
    terminal: bool = False
    common: Attributes = field(default_factory=dict)  # filled once, see shared()
    tokens: tuple[Any, Any] | None = None  # while processing: what to reset at its end

    def attributes(
        self, *, execution_id: str | None = None, fence: int | None = None
    ) -> Attributes:
        """Return the attributes every span of this trace starts with (a new dict).

        :meth:`shared` ones first, then :meth:`own` ones.
        """
        attrs = self.shared().copy()
        attrs.update(self.own(execution_id=execution_id, fence=fence))
        return attrs

    def shared(self) -> Attributes:
        """Return the Kafka coordinates, pod and group: put together once per trace, not copied."""
        return self.common or self._fill_common()

    def own(self, *, execution_id: str | None = None, fence: int | None = None) -> Attributes:
        """Return a span's attributes beyond :meth:`shared` (a new dict).

        The job key, and the execution id and fence known at the span's start
        (default: the trace's).
        """
        attrs: Attributes = {}
        if self.job_key is not None:
            attrs[n.JOB_KEY] = self.job_key
        execution_id = execution_id or self.execution_id
        if execution_id is not None:
            attrs[n.EXECUTION_ID] = execution_id
        fence = self.fence if fence is None else fence
        if fence is not None:
            attrs[n.FENCE] = fence
        return attrs

    def _fill_common(self) -> Attributes:
        common = self.common
        common[n.MESSAGING_SYSTEM] = "kafka"
        common[n.MESSAGING_OPERATION_NAME] = "process"
        common[n.MESSAGING_OPERATION_TYPE] = "process"
        common[n.MESSAGING_DESTINATION] = self.topic
        common[n.MESSAGING_PARTITION] = str(self.partition)
        common[n.MESSAGING_OFFSET] = self.offset
        common[n.POD] = self.pod
        if self.key is not None:
            common[n.MESSAGING_KEY] = self.key
        if self.group is not None:
            common[n.MESSAGING_GROUP] = self.group
        return common

    def identity(self) -> Attributes:
        """Return the attributes learnt after the record arrived: job key, execution, fence."""
        return self.own()


CURRENT: ContextVar[TriggerTrace | None] = ContextVar("leaseworker_trigger_trace", default=None)
"""The trace of the trigger the running task processes, if any."""


def wall_ns(at: float | None = None) -> int:
    """Convert a monotonic ``anyio.current_time()`` value to Unix nanoseconds (default: now).

    A time is never converted to a moment after now.
    """
    now = time.time_ns()
    if at is None:
        return now
    return now - max(0, int((monotonic_now() - at) * 1e9))


def ms(seconds: float) -> float:
    """Seconds to milliseconds, rounded to 0.1 ms for readable attributes."""
    return round(seconds * 1000, 1)


MAX_ACQUIRE_EVENTS = 64
"""Events (busy, retry, lost tries) kept for one ``lease acquire`` span; later ones are counted."""


def note_acquire_event(trace: TriggerTrace, name: str, attributes: Attributes) -> None:
    """Keep an event for the ``lease acquire`` span: the first ones, if the trace records.

    A trigger may wait for its lease for hours (a busy key, Redis down): its
    tries are counted (``busy``), but only the first
    :data:`MAX_ACQUIRE_EVENTS` become span events, so the wait costs no memory.
    """
    if trace.recording and len(trace.acquire_events) < MAX_ACQUIRE_EVENTS:
        trace.acquire_events.append((name, attributes, time.time_ns()))


def error_status(description: str) -> Status:
    """Return the ERROR status with ``description`` (the common ones are made once)."""
    status = _STATUSES.get(description)
    if status is None:
        status = Status(StatusCode.ERROR, description)
        if len(_STATUSES) < 64:
            _STATUSES[description] = status
    return status


_STATUSES: dict[str, Status] = {}


def key_text(key: bytes | None) -> str | None:
    """Return the record key as text; ``None`` when absent or not UTF-8 (semconv)."""
    if key is None:
        return None
    try:
        return key.decode()
    except UnicodeDecodeError:
        return None
