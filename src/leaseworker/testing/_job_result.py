"""``JobResult``: how one trigger ended, built from the executor's events.

The one definition of outcome, reason, dead-letter reason and terminality a
test sees, for a :class:`JobEnvironment` run and an embedded pod's trigger
alike, read from the executor's :class:`Ending` (or its ``finished`` event,
which carries the same outcome and reason).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from .._events import Ending, ExecutionEvent, Reason
from .._history import Scalar, Step
from .._outcome import Outcome
from .._store import OutboxRow


@dataclass(frozen=True, slots=True, kw_only=True)
class JobResult:
    """How one trigger ended in a :class:`JobEnvironment`, and every step on the way.

    ``outcome`` is the last execution's (``None`` when the record never became
    a job); ``reason`` qualifies it: why the lease was lost (``rejected``,
    ``timeout``, ``late``, ``error``, ``deadline``, ...), ``stale``,
    ``store_unavailable``, a malformed record's reason, or whatever reason the
    executor gives. ``dead_letter`` is the reason a pod would dead-letter the
    trigger with (``None``: it would not); ``terminal`` whether a pod would
    commit its offset (``False``: it would retry). ``result`` is what ``run()``
    returned, ``fence`` the last execution's fence, ``completion`` the store's
    answer (``accepted``/``duplicate``/``stale``), ``error`` the exception
    behind the ending. ``events`` are the lifecycle steps in order, ``at``
    seconds after the run started (exact on virtual time): execution events
    (``started``, ``completion``, ``finished``, ``retry``), lease events
    (``acquired``, ``renewed``, ``lost``, ``cancel_requested``, ``stopped``,
    ``released``, ``release_failed``), ``checkpoint`` (``attrs["n"]``) and
    ``fault`` (``attrs["kind"]``). ``cpu_seconds`` and ``peak_memory``
    (bytes) are what the last execution's ``run_in_process`` children cost,
    killed ones included (``None``: it made no such call).
    """

    job_key: str | None
    outcome: Outcome | None
    reason: str | None = None
    dead_letter: str | None = None
    terminal: bool = True
    result: Any = None  # what run() returned; Any, so that a test can index it
    fence: int | None = None
    completion: str | None = None
    error: BaseException | None = None
    detail: str | None = None
    executions: int = 0
    checkpoints: int = 0
    events: tuple[Step, ...] = ()
    statements: tuple[tuple[str, Any], ...] = ()
    """The job's statements (SQL, parameters) its committed transactions ran, in order."""
    messages: tuple[OutboxRow, ...] = ()
    """The messages committed to the outbox (none when the run was refused or failed)."""
    cpu_seconds: float | None = None
    peak_memory: int | None = None

    @property
    def names(self) -> list[str]:
        """The event names in order (``["acquired", "started", ...]``)."""
        return [event.name for event in self.events]

    def at(self, name: str) -> float:
        """Seconds after the start at which the first event ``name`` happened (``KeyError``)."""
        for event in self.events:
            if event.name == name:
                return event.at
        raise KeyError(f"no {name!r} event; events: {self.names}")

    def of(self, name: str) -> list[Step]:
        """Every event named ``name``, in order."""
        return [event for event in self.events if event.name == name]


def ended(
    job_key: str,
    last: ExecutionEvent,
    *,
    ending: Ending | None = None,
    completion: str | None = None,
    executions: int = 1,
    checkpoints: int = 0,
    events: tuple[Step, ...] = (),
) -> JobResult:
    """Build the result of a trigger whose last execution reported ``last`` (``finished``).

    ``ending`` is what the executor returned, when known; otherwise it is read
    from the event (a run stopped at a retry, a pod's trigger).
    """
    if ending is None:
        ending = Ending(last.outcome or "failed", reason=cast(Reason | None, last.reason))
    return JobResult(
        job_key=job_key,
        outcome=ending.outcome,
        reason=ending.reason,
        dead_letter=ending.dead_letter,
        terminal=ending.terminal,
        result=last.result,
        fence=last.fence,
        completion=completion,
        error=last.error,
        executions=executions,
        checkpoints=checkpoints,
        events=events,
        cpu_seconds=last.cpu_seconds,
        peak_memory=last.peak_memory,
    )


def execution_step(event: ExecutionEvent, *, at: float) -> Step:
    """Return ``event`` as a step at ``at``, with its outcome, reason and fence."""
    attrs = scalars(outcome=event.outcome, reason=event.reason, fence=event.fence)
    return Step(at=at, name=event.event, attrs=attrs)


def scalars(**fields: Scalar | None) -> dict[str, Scalar]:
    """Return the fields that are set: ``None`` means absent from a step's attributes."""
    return {name: value for name, value in fields.items() if value is not None}
