"""Log lines: text with the lifecycle fields appended, or one JSON object per record.

:class:`TextFormatter` (the default ``--log-format text``) writes the usual
``time level logger: message`` and then the lifecycle fields the record
carries, ``event=... jobId=... executionId=... pod=... elapsedMs=...``, so
one line says which execution on which pod did what, and how long it took.

A JSON line (:class:`JsonFormatter`) has ``timestamp`` (wall clock, UTC,
RFC 3339 with milliseconds), ``level``, ``logger`` and ``message``, then whatever the call passed in
``extra=`` (leaseworker passes ``jobId``, ``executionId``, ``pod``, ``event``,
``elapsedMs``, ``outcome``, ``renewalOutcome``, ``reason``...), then ``traceId``
and ``spanId`` of the span current when the line was logged, so a log line
leads to its trace. Payloads are never passed to the logger, so they never
appear here.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any, final

from opentelemetry.trace import format_span_id, format_trace_id, get_current_span

_STANDARD = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys()
    | {"message", "asctime", "taskName"}
)
"""LogRecord attributes that are not ``extra=`` fields."""


TEXT_FIELDS = (
    "event",
    "jobId",
    "executionId",
    "pod",
    "elapsedMs",
    "outcome",
    "reason",
    "fence",
    "retryInMs",
)
"""The ``extra=`` fields :class:`TextFormatter` appends, in this order, when a record has them."""


@final
class TextFormatter(logging.Formatter):
    """``time level logger: message``, then the record's lifecycle fields as ``name=value``.

    A value with a space, a quote or an ``=`` is written as a JSON string, so
    the line still splits into fields.
    """

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        """Return the line for ``record`` (tracebacks follow on their own lines)."""
        text = super().format(record)
        fields = [
            f"{name}={_text_value(value)}"
            for name in TEXT_FIELDS
            if (value := record.__dict__.get(name)) is not None
        ]
        if not fields:
            return text
        first, newline, rest = text.partition("\n")
        return f"{first} | {' '.join(fields)}{newline}{rest}"


def _text_value(value: object) -> str:
    text = str(value)
    if text and not any(c in text for c in ' "=|') and text.isprintable():
        return text
    return json.dumps(text, ensure_ascii=False)


@final
class JsonFormatter(logging.Formatter):
    """Format a record as one JSON object on one line (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        """Return the JSON line for ``record``."""
        line: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in record.__dict__.items():
            if name not in _STANDARD and value is not None:
                line[name] = value
        if "traceId" not in line:
            context = get_current_span().get_span_context()
            if context.is_valid:
                line["traceId"] = format_trace_id(context.trace_id)
                line["spanId"] = format_span_id(context.span_id)
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)
