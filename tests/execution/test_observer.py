"""The logging observer: one structured record per event, never a payload quote."""

from __future__ import annotations

import logging

import pytest

from leaseworker import Attempt, ExecutionEvent, LeaseLost, Trigger
from leaseworker._execution import LoggingObserver

SECRET = "customer-4711-secret-amount"


def _event(error: BaseException, outcome: str = "failed") -> ExecutionEvent:
    trigger = Trigger(
        topic="reports",
        partition=0,
        offset=7,
        key="report:acme:2026-11",
        headers=(),
        timestamp=None,
        payload={"note": SECRET},
    )
    attempt = Attempt(
        trigger=trigger,
        job_key="report:acme:2026-11",
        input_version="v1",
        execution_id="e1",
        pod="pod-a",
    )
    return ExecutionEvent(
        event="finished",
        attempt=attempt,
        outcome=outcome,  # type: ignore[arg-type]
        error=error,
    )


def test_a_jobs_exception_message_is_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    """A job error may quote payload data: the log names its type, not its message."""
    with caplog.at_level(logging.INFO, logger="leaseworker.execution"):
        LoggingObserver().on_event(_event(ValueError(f"bad row for {SECRET}")))
    [record] = caplog.records
    assert "ValueError" in record.getMessage()
    assert SECRET not in record.getMessage()
    assert record.__dict__["jobId"] == "report:acme:2026-11"
    assert record.__dict__["executionId"] == "e1"
    assert SECRET not in str(record.__dict__)


def test_leaseworkers_own_error_messages_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    """Leaseworker's messages carry keys, fences and reasons only: they stay in the log."""
    lost = LeaseLost("report:acme:2026-11", fence=42, reason="rejected")
    with caplog.at_level(logging.INFO, logger="leaseworker.execution"):
        LoggingObserver().on_event(_event(lost, outcome="lost"))
    [record] = caplog.records
    assert "fence 42" in record.getMessage()
    assert "rejected" in record.getMessage()


def test_log_job_errors_adds_the_message_and_the_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Opted in (``--log-job-errors``): the job's message and traceback reach the record."""
    with pytest.raises(ValueError, match="bad row") as raised:
        _fail_with(f"bad row for {SECRET}")
    error = raised.value
    with caplog.at_level(logging.INFO, logger="leaseworker.execution"):
        LoggingObserver(log_job_errors=True).on_event(_event(error))
    [record] = caplog.records
    assert f"ValueError: bad row for {SECRET}" in record.getMessage()
    assert record.exc_info is not None
    assert record.exc_info[1] is error
    assert "_fail_with" in caplog.text  # the traceback's frames


def test_log_job_errors_leaves_leaseworkers_own_errors_as_they_were(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A lease loss is not a job error: no traceback, the same one-line text."""
    lost = LeaseLost("report:acme:2026-11", fence=42, reason="rejected")
    with caplog.at_level(logging.INFO, logger="leaseworker.execution"):
        LoggingObserver(log_job_errors=True).on_event(_event(lost, outcome="lost"))
        LoggingObserver().on_event(_event(lost, outcome="lost"))
    opted, default = caplog.records
    assert opted.getMessage() == default.getMessage()
    assert opted.exc_info is None


def _fail_with(message: str) -> None:
    raise ValueError(message)
