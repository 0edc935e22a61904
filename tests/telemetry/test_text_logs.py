"""The default text log line: the message, then the lifecycle fields, one line per event."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from leaseworker._telemetry import TextFormatter

pytestmark = pytest.mark.fake  # a formatter and a logger: no service


def _line(**extra: object) -> str:
    record = logging.LogRecord("leaseworker.execution", logging.INFO, "f", 1, "msg", None, None)
    record.__dict__.update(extra)
    return TextFormatter().format(record)


def test_a_lifecycle_record_shows_job_execution_pod_event_and_elapsed_ms() -> None:
    """The fields follow the message as name=value, in one fixed order; absent ones are left out."""
    fields = {"jobId": "report:a", "executionId": "e1", "pod": "pod-a", "event": "finished"}
    line = _line(**fields, elapsedMs=12.5, fence=None)
    assert line.endswith(
        "INFO leaseworker.execution: msg | event=finished jobId=report:a executionId=e1 "
        "pod=pod-a elapsedMs=12.5"
    )
    assert "\n" not in line
    assert _line().endswith("INFO leaseworker.execution: msg")  # no fields, no separator


def test_a_value_that_would_split_the_line_is_quoted() -> None:
    """Spaces, quotes, ``=`` and control characters in a job key stay inside one field."""
    line = _line(jobId='report a="b"\n', pod="pod-a")
    assert 'jobId="report a=\\"b\\"\\n" pod=pod-a' in line
    assert "\n" not in line


def test_the_logging_observer_line_in_the_default_format_names_the_execution() -> None:
    """``leaseworker run``'s default (--log-format text) writes these fields on every event."""
    script = """
from leaseworker import Attempt, ExecutionEvent, LoggingObserver, Trigger
from leaseworker._cli._main import _setup_logging

_setup_logging("INFO", "text")
trigger = Trigger(topic="t", partition=0, offset=3, key="report:a", headers=(),
                  timestamp=None, payload={})
attempt = Attempt(trigger=trigger, job_key="report:a", input_version="v", execution_id="e1",
                  pod="pod-a")
LoggingObserver()(ExecutionEvent(event="finished", attempt=attempt, elapsed=0.25,
                                 outcome="completed"))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=True
    )
    [line] = result.stderr.splitlines()
    assert "INFO leaseworker.execution: finished job 'report:a' execution e1: completed" in line
    assert line.endswith(
        "| event=finished jobId=report:a executionId=e1 pod=pod-a elapsedMs=250.0 outcome=completed"
    )
