"""JSON log lines: one object per record, with the lifecycle fields and the trace ids.

Every line has ``timestamp`` (wall clock, UTC, RFC 3339 with milliseconds),
``level``, ``logger`` and ``message``, then whatever the call passed in
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
