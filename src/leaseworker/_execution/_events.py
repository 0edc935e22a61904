"""The log lines of executions: :class:`LoggingObserver`, a hook.

Every point a log line hangs on is an :class:`~leaseworker.ExecutionEvent`
passed to the executor's hooks. The worker ships :class:`LoggingObserver`,
which writes one structured record per execution event with the fields
``jobId``, ``executionId``, ``pod``, ``event`` and ``elapsedMs`` (via
``extra=``); telemetry and the history recorder are hooks beside it. Payloads
and results are never logged.
"""

from __future__ import annotations

import logging
from typing import Protocol, final

from .._errors import LeaseworkerError
from .._events import Event, ExecutionEvent


class ExecutionObserver(Protocol):
    """Deprecated: pass hooks (``Pod(hooks=...)``); an observer is adapted to one."""

    def on_event(self, event: ExecutionEvent) -> None:
        """Handle one lifecycle event."""
        ...


@final
class LoggingObserver:
    """Log one structured record per lifecycle event on ``leaseworker.execution``.

    A job's own exception is named by its type only, because its message may
    quote payload data. ``log_job_errors=True`` (``--log-job-errors``) adds
    the message and the traceback, for teams whose job errors carry no
    personal data or whose logs may hold it.
    """

    accepts = (ExecutionEvent,)
    """The events it logs: a lease or source step builds no event for it."""

    def __init__(
        self, logger: logging.Logger | None = None, *, log_job_errors: bool = False
    ) -> None:
        self._logger = logger or logging.getLogger("leaseworker.execution")
        self._log_job_errors = log_job_errors

    def __call__(self, event: Event) -> None:
        """Log an execution event (the hook); other events are not its to log."""
        if isinstance(event, ExecutionEvent) and event.event != "acquiring":
            self.on_event(event)

    def on_event(self, event: ExecutionEvent) -> None:
        """Write the event: failures and losses at WARNING, the rest at INFO/DEBUG.

        A retry is INFO with its wait (DEBUG after ``busy``: waiting for
        another pod's lease is the normal case, and frequent).
        """
        level = _level(event)
        if not self._logger.isEnabledFor(level):
            return
        if event.event == "retry":
            self._logger.log(level, "%s", _retry_text(event), extra=_fields(event))
            return
        text = f"{event.event} job {event.job_key!r} execution {event.execution_id}"
        if event.outcome is not None:
            text += f": {event.outcome}"
        if event.reason is not None:
            text += f" ({event.reason})"
        shown_error: BaseException | None = None
        if event.error is not None:
            if self._log_job_errors and not isinstance(event.error, LeaseworkerError):
                shown_error = event.error
                text += f" ({type(event.error).__name__}: {event.error})"
            else:
                text += f" ({_describe(event.error)})"
        if event.retry_in is not None:
            text += f"; retry in {event.retry_in:.2f}s"
        self._logger.log(level, "%s", text, extra=_fields(event), exc_info=shown_error)


@final
class ObserverHook:
    """A deprecated :class:`ExecutionObserver` as a hook: it gets the execution events only."""

    accepts = (ExecutionEvent,)

    def __init__(self, observer: ExecutionObserver) -> None:
        self._observer = observer

    def __call__(self, event: Event) -> None:
        if isinstance(event, ExecutionEvent):
            self._observer.on_event(event)


EVENT_LOG_LEVELS: dict[str, int] = {
    "busy": logging.DEBUG,
    "failed": logging.WARNING,
    "lost": logging.WARNING,
    "stale": logging.WARNING,
    "timed_out": logging.WARNING,
}


def _level(event: ExecutionEvent) -> int:
    if event.event == "retry":
        return logging.DEBUG if event.outcome == "busy" else logging.INFO
    level = EVENT_LOG_LEVELS.get(event.outcome or event.event, logging.INFO)
    return EVENT_LOG_LEVELS.get(event.reason or "", level)  # a stale completion warns


def _retry_text(event: ExecutionEvent) -> str:
    ended: str = event.outcome or "unknown"
    if event.reason is not None:
        ended += f" ({event.reason})"
    return (
        f"retry job {event.job_key!r}: execution {event.execution_id} ended {ended}; "
        f"the next one starts in {event.retry_in or 0.0:.2f}s"
    )


def _fields(event: ExecutionEvent) -> dict[str, object]:
    return {
        "jobId": event.job_key,
        "executionId": event.execution_id,
        "pod": event.pod,
        "event": event.event,
        "elapsedMs": round(event.elapsed * 1000, 1),
        "outcome": event.outcome,
        "reason": event.reason,
        "fence": event.fence,
        "topic": event.trigger.topic,
        "partition": event.trigger.partition,
        "offset": event.trigger.offset,
        "retryInMs": None if event.retry_in is None else round(event.retry_in * 1000, 1),
    }


def _describe(error: BaseException) -> str:
    """Name the error; quote its message only when leaseworker wrote it.

    A job's own exception message may quote payload data (a customer name, an
    amount), which must not reach the logs by default; leaseworker's messages
    carry only job keys, fences and reasons.
    """
    if isinstance(error, LeaseworkerError):
        return f"{type(error).__name__}: {error}"
    return f"{type(error).__name__}; its message is not logged, it may quote payload data"
