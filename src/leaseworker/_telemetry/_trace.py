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

import anyio
from opentelemetry.context import Context
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from . import _names as n

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
    started_ns: int = field(default_factory=time.time_ns)
    job_key: str | None = None
    received: bool = False  # decoded; its ``trigger received`` span is still to be sent
    execution_id: str | None = None
    fence: int | None = None
    acquire: Span | None = None
    acquire_began: float = 0.0
    busy: int = 0
    run: Span | None = None
    outcome: str | None = None
    terminal: bool = False

    def attributes(
        self, *, execution_id: str | None = None, fence: int | None = None
    ) -> Attributes:
        """Return the attributes every span of this trace starts with."""
        attrs: Attributes = {
            n.MESSAGING_SYSTEM: "kafka",
            n.MESSAGING_OPERATION_NAME: "process",
            n.MESSAGING_OPERATION_TYPE: "process",
            n.MESSAGING_DESTINATION: self.topic,
            n.MESSAGING_PARTITION: str(self.partition),
            n.MESSAGING_OFFSET: self.offset,
            n.POD: self.pod,
        }
        if self.key is not None:
            attrs[n.MESSAGING_KEY] = self.key
        if self.group is not None:
            attrs[n.MESSAGING_GROUP] = self.group
        if self.job_key is not None:
            attrs[n.JOB_KEY] = self.job_key
        execution_id = execution_id or self.execution_id
        if execution_id is not None:
            attrs[n.EXECUTION_ID] = execution_id
        fence = self.fence if fence is None else fence
        if fence is not None:
            attrs[n.FENCE] = fence
        return attrs

    def identity(self) -> Attributes:
        """Return the attributes learnt after the record arrived: job key, execution, fence."""
        attrs: Attributes = {}
        if self.job_key is not None:
            attrs[n.JOB_KEY] = self.job_key
        if self.execution_id is not None:
            attrs[n.EXECUTION_ID] = self.execution_id
        if self.fence is not None:
            attrs[n.FENCE] = self.fence
        return attrs


CURRENT: ContextVar[TriggerTrace | None] = ContextVar("leaseworker_trigger_trace", default=None)
"""The trace of the trigger the running task processes, if any."""


def wall_ns(at: float | None = None) -> int:
    """Convert a monotonic ``anyio.current_time()`` value to Unix nanoseconds (default: now)."""
    now = time.time_ns()
    if at is None:
        return now
    return now - max(0, int((anyio.current_time() - at) * 1e9))


def ms(seconds: float) -> float:
    """Seconds to milliseconds, rounded to 0.1 ms for readable attributes."""
    return round(seconds * 1000, 1)
