"""How an execution ends (:class:`Ending`) and the steps of its trigger (:class:`ExecutionEvent`).

One outcome type with one vocabulary: the executor's every branch returns an
:class:`Ending` (outcome + reason), and the ``finished`` event, the log line,
the span, the metric label, the history and the testing kit's ``JobResult``
all read that outcome and reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, get_args

from .._errors import BadResult, ChildProcessDied
from .._outcome import (
    JOB_FAILURES,
    REFUSALS,
    DeadLetterReason,
    EndingReason,
    LeaseLostReason,
    Outcome,
    ends_trigger,
)
from ._identity import Attempt, Trigger

LOSS_REASONS: Final[frozenset[LeaseLostReason]] = frozenset(get_args(LeaseLostReason))

Reason = EndingReason | LeaseLostReason
"""What qualifies an outcome: why a lease was lost, or an :data:`EndingReason`."""


@dataclass(frozen=True, slots=True)
class Ending:
    """How an execution ended: its outcome, why, and whether the trigger is done.

    ``reason`` qualifies the outcome in one vocabulary: why a ``lost``
    execution lost its lease (``rejected``, ``timeout``, ``deadline``...), or an
    :data:`~leaseworker._outcome.EndingReason` (``stale``, ``store_unavailable``,
    ``lost_repeatedly``, ``bad_result``, ``bad_input_version``). ``error_type``
    is the class name of the exception that made a ``failed`` or ``timed_out``
    execution end: the dead letter names it, never its message (it may quote
    payload data). ``loss_reason`` is why the lease was lost, kept also when
    ``reason`` says more (``lost_repeatedly``); ``detail`` a one-line
    description leaseworker wrote, for a dead letter; ``retry_after`` the
    holder's remaining TTL of a ``busy`` ending, when known.
    """

    outcome: Outcome
    reason: Reason | None = None
    error_type: str | None = None
    loss_reason: LeaseLostReason | None = None
    detail: str | None = None
    retry_after: float | None = None

    @property
    def terminal(self) -> bool:
        """Whether the trigger is done (its offset may be committed); see ``ends_trigger``."""
        return ends_trigger(self.outcome, self.reason)

    @property
    def dead_letter(self) -> DeadLetterReason | None:
        """The reason the trigger is dead-lettered with, if this ending dead-letters it."""
        for refusal in REFUSALS:
            if self.reason == refusal:
                return refusal
        return JOB_FAILURES.get(self.outcome)

    @classmethod
    def of_error(
        cls, outcome: Outcome, error: BaseException, loss_reason: LeaseLostReason | None = None
    ) -> Ending:
        """Return the ending of an execution stopped by ``error`` (a failure keeps its type)."""
        error_type = type(error).__name__ if outcome in JOB_FAILURES else None
        if outcome == "failed" and isinstance(error, BadResult):
            return cls(outcome, reason="bad_result", error_type=error_type, detail=error.detail)
        if outcome == "failed" and isinstance(error, ChildProcessDied):
            return cls(outcome, reason="child_died", error_type=error_type, detail=str(error))
        return cls(outcome, reason=loss_reason, error_type=error_type, loss_reason=loss_reason)


ExecutionEventName = Literal["acquiring", "started", "completion", "finished", "retry"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionEvent:
    """One step in the life of a trigger's executions, about one :class:`Attempt`.

    ``acquiring``: an execution is about to acquire its lease (the store said
    the identity has not completed); its lease events follow. ``started``: an
    execution holds the lease and its job runs (``elapsed`` is how long the
    acquire took). ``finished``: an execution ended with
    ``outcome`` and ``reason`` (``busy`` when the lease was held elsewhere;
    ``elapsed`` is the execution's whole duration). ``retry``: another
    execution of the same trigger follows after ``retry_in`` seconds
    (``outcome`` and ``reason``: how the execution before it ended).
    ``completion``: the store answered the execution's completion (``reason``
    is the store's status, ``accepted``/``duplicate``/``stale``; ``elapsed`` the
    store call's duration, ``answered_at`` when its answer came, on the lease
    clock: the event itself comes after the release). ``error`` is the
    exception behind a non-completed outcome, if any; ``result`` is what a
    completed ``run`` returned (for hooks that store results; never logged).
    ``cpu_seconds`` and ``peak_memory`` (bytes): what the execution's
    ``run_in_process`` calls cost in their children, killed ones included
    (``finished`` only; ``None`` when it made none).
    """

    event: ExecutionEventName
    attempt: Attempt
    elapsed: float = 0.0
    outcome: Outcome | None = None
    reason: str | None = None
    fence: int | None = None
    retry_in: float | None = None
    answered_at: float | None = None
    error: BaseException | None = None
    result: object = None
    cpu_seconds: float | None = None
    peak_memory: int | None = None

    @property
    def job_key(self) -> str:
        """The attempt's job key."""
        return self.attempt.job_key

    @property
    def execution_id(self) -> str:
        """The attempt's execution id."""
        return self.attempt.execution_id

    @property
    def pod(self) -> str:
        """The pod running the attempt."""
        return self.attempt.pod

    @property
    def trigger(self) -> Trigger:
        """The trigger the attempt runs for."""
        return self.attempt.trigger

    @property
    def terminal(self) -> bool:
        """Whether this ``finished`` event ends the trigger (its offset may be committed)."""
        return self.outcome is not None and ends_trigger(self.outcome, self.reason)
