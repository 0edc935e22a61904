"""The execution recorder: every execution's start and stop, appended to a history file.

``leaseworker run --record-history FILE`` adds a :class:`HistoryRecorder`
hook beside the logging one. It writes a :mod:`leaseworker._history` record
file on the event loop's monotonic clock (``time.monotonic()``, which every
process on one Linux machine shares, so the files of several pods merge into
one history): a line when an execution acquired its lease, and the full
execution once it ended, both flushed at once, so an execution whose pod was
killed still shows, open-ended. It records identifiers, fences, outcomes,
reasons and the Kafka position, never payloads or results. The fault campaign
(``leaseworker chaos``) checks these files; any job works with it unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import final

from .._events import Event, ExecutionEvent, LeaseEvent, Trigger
from .._history import Execution, Scalar, Step, header_line, record_line
from .._lease import now

logger = logging.getLogger("leaseworker.pod")


@dataclass(slots=True)
class _Draft:
    """What is known of one running execution so far."""

    start: float
    fence: int
    expires_at: float | None = None
    stopped_at: float | None = None
    released_at: float | None = None
    loss: str | None = None
    completion: str | None = None
    steps: list[Step] = field(default_factory=list)


@final
class HistoryRecorder:
    """Append every execution of this pod to ``path`` (a hook of execution and lease events).

    ::

        recorder = HistoryRecorder(Path("history-pod-1.jsonl"))
        worker = Pod(job, config, recorder=recorder)

    An execution's ``start`` is when its acquire was answered; its ``end`` is
    when its body stopped (the loss's ``stopped`` step) or, without a loss,
    when its release was sent: the lease was still held until then. Steps:
    ``acquired``, ``lost`` (``reason``), ``stopped`` (``latency_ms`` and
    ``margin_ms``, the time left before Redis could expire the key),
    ``completion`` (``status``), ``released``. Writing never raises into the
    worker: a failed write is logged once and recording stops. Each line is
    appended with its own open and close (two per execution), so the file
    needs no closing and a killed pod loses nothing. The input version is
    the attempt's (``input_version``, the job's method, is no longer asked:
    accepted for callers that pass it).
    """

    accepts = (ExecutionEvent, LeaseEvent)

    def __init__(
        self, path: Path, *, input_version: Callable[[Trigger], str] | None = None
    ) -> None:
        self._drafts: dict[str, _Draft] = {}
        self._path: Path | None = path
        with path.open("a", encoding="utf-8") as file:  # raises OSError now, not mid-run
            if file.tell() == 0:  # a restarted pod appends to its earlier file
                file.write(header_line("monotonic"))

    def close(self) -> None:
        """Stop recording (executions still running stay open-ended in the file)."""
        self._path = None

    def __call__(self, event: Event) -> None:
        """Note a lease event into its execution's draft; record an execution event."""
        if isinstance(event, ExecutionEvent):
            self.on_event(event)
        elif isinstance(event, LeaseEvent) and event.attempt is not None:
            self._lease_event(event.attempt.execution_id, event)

    def on_event(self, event: ExecutionEvent) -> None:
        """Record an execution's start line, its completion answer and its end."""
        draft = self._drafts.get(event.execution_id)
        if draft is None:
            return  # never acquired (busy, or answered from the store): nothing ran
        if event.event == "started":
            self._write(record_line(self._execution(event, draft, ended=False)))
        elif event.event == "completion":
            # Reported after the release, which a paused pod may send long after
            # the store answered: placed when the answer came (the lease's clock).
            draft.completion = event.reason
            answered = event.answered_at
            if answered is None:  # an emitter that did not say when: the answer preceded these
                answered = draft.released_at or draft.stopped_at or now()
            status: dict[str, Scalar] = {"status": event.reason or "", "fence": event.fence or 0}
            draft.steps.append(
                Step(
                    at=answered - event.elapsed,
                    name="completion",
                    duration=event.elapsed,
                    attrs=status,
                )
            )
        elif event.event == "finished":
            del self._drafts[event.execution_id]
            self._write(record_line(self._execution(event, draft, ended=True)))

    def _execution(self, event: ExecutionEvent, draft: _Draft, *, ended: bool) -> Execution:
        trigger = event.trigger
        end = None
        if ended:
            end = draft.stopped_at or draft.released_at or now()
        return Execution(
            job_key=event.job_key,
            execution_id=event.execution_id,
            pod=event.pod,
            start=draft.start,
            end=end,
            fence=draft.fence,
            input_version=event.attempt.input_version,
            outcome=event.outcome if ended else None,
            reason=(event.reason or draft.loss) if ended else None,
            completion=draft.completion,
            topic=trigger.topic,
            partition=trigger.partition,
            offset=trigger.offset,
            steps=tuple(sorted(draft.steps, key=lambda step: step.at)),
            cpu_seconds=event.cpu_seconds if ended else None,
        )

    def _lease_event(self, execution_id: str, event: LeaseEvent) -> None:
        """Note one lease event of an execution into its draft (made at ``acquired``)."""
        if event.name == "acquired":
            acquired = Step(at=event.at, name="acquired", attrs={"fence": event.fence})
            self._drafts[execution_id] = _Draft(
                start=event.at, fence=event.fence, expires_at=event.expires_at, steps=[acquired]
            )
            return
        draft = self._drafts.get(execution_id)
        if draft is None:
            return
        if event.name == "renewed":
            draft.expires_at = event.expires_at
        elif event.name == "lost":
            draft.loss = event.reason
            draft.steps.append(Step(at=event.at, name="lost", attrs={"reason": event.reason or ""}))
        elif event.name == "stopped":
            draft.stopped_at = event.at
            attrs = {"latency_ms": round((event.stop_latency or 0.0) * 1000, 3)}
            if draft.expires_at is not None:
                attrs["margin_ms"] = round((draft.expires_at - event.at) * 1000, 3)
            draft.steps.append(Step(at=event.at, name="stopped", attrs=attrs))
        elif event.name in ("released", "release_failed"):
            draft.released_at = released = event.at - (event.round_trip or 0.0)
            attrs = {}
            if draft.expires_at is not None:
                attrs["margin_ms"] = round((draft.expires_at - released) * 1000, 3)
            draft.steps.append(Step(at=released, name=event.name, attrs=attrs))

    def _write(self, line: str) -> None:
        """Append one line; the file is opened per line, so nothing is left to close."""
        if self._path is None:
            return
        try:
            with self._path.open("a", encoding="utf-8") as file:
                file.write(line)  # closed: in the kernel, a killed pod loses none of it
        except OSError as exc:
            logger.warning("history recorder stopped: %s", exc, extra={"event": "recorder_failed"})
            self._path = None
