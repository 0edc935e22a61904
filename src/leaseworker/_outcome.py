"""Outcomes and reason codes: each word of the vocabulary defined once, as a ``Literal``.

How an execution ends (:data:`Outcome`), which endings finish a trigger
(:data:`TERMINAL`, :func:`ends_trigger`), which of those are dead-lettered
(:data:`JOB_FAILURES`), and the stable codes behind a lost lease or a dead
letter. The values are the strings logs, spans, metrics and dead-letter headers
carry. The bottom of the package: it imports nothing of leaseworker, so the
lease layer and ``_errors`` can use it. See ``docs/design.md`` (outcomes and
reason codes) and ``docs/workers.md`` (what each outcome does to its trigger).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, Literal, get_args

Outcome = Literal["completed", "duplicate", "lost", "timed_out", "failed", "cancelled", "busy"]
"""How an execution ended.

``completed``: the job ran and its completion (if any) was accepted;
``duplicate``: its identity had completed already (answered from the store);
``lost``: ownership became uncertain; ``timed_out``: it outlived
``max_runtime``; ``failed``: the job raised; ``cancelled``: shutdown or a
rebalance stopped it; ``busy``: another owner holds the lease. A held lease
(:attr:`~leaseworker.HeldLease.outcome`) never ends ``duplicate``: that answer
comes from the store before any lease is taken.
"""

OUTCOMES: Final[tuple[Outcome, ...]] = get_args(Outcome)
"""Every :data:`Outcome`, in the order above."""

TERMINAL: Final[frozenset[Outcome]] = frozenset({"completed", "duplicate", "failed", "timed_out"})
"""Outcomes after which a trigger is done and its offset may be committed.

``lost``, ``busy`` and ``cancelled`` are not terminal: the job did not reach an
end, so the trigger is retried (or, after shutdown or a rebalance,
redelivered). One exception, see :func:`ends_trigger`: ``lost`` with reason
``stale``.
"""

RefusalReason = Literal["lost_repeatedly", "bad_result", "bad_input_version"]
"""Dead-letter reason of a trigger the executor ended without the job raising.

``lost_repeatedly``: its executions lost their lease as many times in a row as
the job's loss budget allows (a job that outlives its lease on every attempt);
``bad_result``: the job returned (or passed to ``complete()``) a result the
store cannot keep (not JSON, a non-string key, too large); ``bad_input_version``:
the trigger's input version cannot be stored (a NUL, a lone surrogate, not a
string), so the job never ran.
"""

REFUSALS: Final[frozenset[RefusalReason]] = frozenset(get_args(RefusalReason))
"""Every :data:`RefusalReason`: endings that finish their trigger with a dead letter."""

EndingReason = Literal["stale", "store_unavailable", "child_died", RefusalReason]
"""What qualifies an ending that no lease event explains.

``stale``: the store refused the completion because a newer fence completed the
job key (final: the newer completion is durable); ``store_unavailable``: the
store could not say whether the trigger completed already (retried);
``child_died``: a ``run_in_process`` child died by itself (a signal such as
SIGSEGV or the OOM killer's SIGKILL, or an exit): ``failed``, dead-lettered
``job_failed`` like any failure; the
:data:`RefusalReason` codes: the trigger ends in a dead letter of that reason
(``lost_repeatedly`` qualifies ``lost``, the others ``failed``).
"""

JobFailureReason = Literal["job_failed", "job_timed_out"]
"""Dead-letter reason of a trigger whose job ended ``failed`` or ``timed_out``."""

JOB_FAILURES: Final[Mapping[Outcome, JobFailureReason]] = MappingProxyType(
    {"failed": "job_failed", "timed_out": "job_timed_out"}
)
"""The terminal outcomes that end in a dead letter, and the reason each one gets."""

MalformedReason = Literal[
    "too_large", "not_json", "not_object", "bad_key", "no_job_key", "bad_job_key", "job_key_error"
]
"""Why a Kafka record cannot become a job (:attr:`~leaseworker.MalformedTrigger.reason`)."""

DeadLetterReason = Literal[MalformedReason, JobFailureReason, RefusalReason]
"""Why a record was dead-lettered: the ``leaseworker.error`` header and the metric's label."""

LeaseLostReason = Literal[
    "rejected", "timeout", "error", "late", "unreplicated", "deadline", "loop_blocked"
]
"""Why ownership of a held lease became uncertain (:attr:`~leaseworker.LeaseLost.reason`).

``rejected``: another owner, or the key is gone; ``timeout`` or ``error``: the
renewal got no answer; ``late``: the answer came after the local deadline;
``unreplicated``: fewer replicas than required acknowledged the renewal;
``deadline``: a renewal was sent but not confirmed in time; ``loop_blocked``:
the event loop was stalled past the deadline (no renewal could even be sent,
before the first renewal or after one).
"""


def ends_trigger(outcome: Outcome, reason: str | None = None) -> bool:
    """Whether an execution that ended ``outcome`` (for ``reason``) finishes its trigger.

    True for the :data:`TERMINAL` outcomes, and for ``lost`` with reason
    ``stale`` (the store refused the completion because a newer fence's
    completion is durable, so running the job again could not help) or
    ``lost_repeatedly`` (the loss budget is spent: the trigger is dead-lettered).
    """
    return outcome in TERMINAL or (outcome == "lost" and reason in _FINAL_LOSSES)


_FINAL_LOSSES: Final = frozenset({"stale", "lost_repeatedly"})


__all__ = [
    "JOB_FAILURES",
    "OUTCOMES",
    "REFUSALS",
    "TERMINAL",
    "DeadLetterReason",
    "EndingReason",
    "JobFailureReason",
    "LeaseLostReason",
    "MalformedReason",
    "Outcome",
    "RefusalReason",
    "ends_trigger",
]
