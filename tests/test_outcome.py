"""The outcome vocabulary and its reason codes are defined once; every user agrees with it.

A copy of an outcome or reason string that drifts from ``leaseworker._outcome``
(a new outcome one module knows and the next does not, a terminal set that
differs between the executor and its events) fails here.
"""

from __future__ import annotations

from typing import get_args

import pytest

import leaseworker
from leaseworker._events import ExecutionEventName as EventName
from leaseworker._execution import EVENT_LOG_LEVELS
from leaseworker._outcome import (
    JOB_FAILURES,
    OUTCOMES,
    REFUSALS,
    TERMINAL,
    DeadLetterReason,
    EndingReason,
    JobFailureReason,
    LeaseLostReason,
    MalformedReason,
    ends_trigger,
)
from leaseworker._telemetry import ERROR_OUTCOMES, RENEWAL_LOSSES

pytestmark = pytest.mark.fake  # pure checks of constants

DESIGN_OUTCOMES = ("completed", "duplicate", "lost", "timed_out", "failed", "cancelled", "busy")
"""The outcome row of the vocabulary in DESIGN.md, word for word."""


def test_the_outcomes_are_the_design_vocabulary_and_the_public_alias() -> None:
    """``Outcome`` names exactly DESIGN.md's outcomes; ``leaseworker.Outcome`` is that alias."""
    assert OUTCOMES == DESIGN_OUTCOMES
    assert get_args(leaseworker.Outcome) == DESIGN_OUTCOMES


def test_terminal_outcomes_end_a_trigger_and_the_others_are_retried() -> None:
    """Completed, duplicate, failed and timed_out end a trigger; lost, busy, cancelled do not."""
    assert {"completed", "duplicate", "failed", "timed_out"} == TERMINAL
    for outcome in OUTCOMES:
        assert ends_trigger(outcome) == (outcome in TERMINAL), outcome


def test_only_a_stale_loss_or_a_spent_loss_budget_ends_its_trigger() -> None:
    """A stale completion or a spent loss budget makes ``lost`` final; nothing else does."""
    assert ends_trigger("lost", "stale")
    assert ends_trigger("lost", "lost_repeatedly")
    assert not ends_trigger("lost", "store_unavailable")
    assert not ends_trigger("lost")
    assert not ends_trigger("busy", "stale")
    assert not ends_trigger("cancelled", "stale")
    assert not ends_trigger("cancelled", "lost_repeatedly")
    assert set(get_args(EndingReason)) == {"stale", "store_unavailable", "child_died", *REFUSALS}
    assert ends_trigger("failed", "child_died")  # a child that died by itself: a failure
    assert {"lost_repeatedly", "bad_result", "bad_input_version"} == REFUSALS


def test_dead_lettered_outcomes_are_terminal_and_named_after_their_outcome() -> None:
    """``failed`` and ``timed_out`` (terminal) are dead-lettered as ``job_<outcome>``."""
    assert set(JOB_FAILURES) == {"failed", "timed_out"}
    assert set(JOB_FAILURES) <= TERMINAL
    for outcome, reason in JOB_FAILURES.items():
        assert reason == f"job_{outcome}"
    assert set(JOB_FAILURES.values()) == set(get_args(JobFailureReason))


def test_dead_letter_reasons_are_the_malformed_reasons_the_failures_and_the_refusals() -> None:
    """Every dead letter carries one code of one list, and the public alias is that list."""
    malformed = set(get_args(MalformedReason))
    failures = set(get_args(JobFailureReason))
    assert not malformed & failures
    assert not (malformed | failures) & REFUSALS
    assert set(get_args(DeadLetterReason)) == malformed | failures | REFUSALS
    assert leaseworker.DeadLetterReason is DeadLetterReason
    assert malformed == {
        "too_large",
        "not_json",
        "not_object",
        "bad_key",
        "no_job_key",
        "bad_job_key",
        "job_key_error",
    }


def test_lease_lost_reasons_are_one_list_and_telemetry_uses_only_those() -> None:
    """Telemetry's renewal losses are lease-lost reasons; the public alias is the list."""
    reasons = set(get_args(LeaseLostReason))
    assert reasons == {
        "rejected",
        "timeout",
        "error",
        "late",
        "unreplicated",
        "deadline",
        "loop_blocked",
    }
    assert leaseworker.LeaseLostReason is LeaseLostReason
    assert reasons >= RENEWAL_LOSSES


def test_telemetry_and_log_levels_name_only_known_outcomes() -> None:
    """Error spans and log levels use outcome words (plus the trigger-level ``malformed``)."""
    assert ERROR_OUTCOMES - {"malformed"} <= set(OUTCOMES)
    assert set(JOB_FAILURES) | {"lost"} <= ERROR_OUTCOMES
    known = set(OUTCOMES) | set(get_args(EventName)) | set(get_args(EndingReason))
    assert set(EVENT_LOG_LEVELS) <= known
