"""Dead letters: records that cannot become a job, and jobs that failed, set aside.

A malformed record is logged by reason and position, never by its contents;
then it, like a trigger whose job failed or timed out, is copied to the
dead-letter topic (when one is set) with headers saying why and where from,
retried until it is sent. A copy too large for Kafka is sent without its
payload, then without its own headers: the original stays in its topic.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, final

import anyio
from aiokafka.errors import KafkaError, MessageSizeTooLargeError  # type: ignore[import-untyped]

from .._backoff import Backoff
from .._errors import MalformedTrigger
from .._outcome import DeadLetterReason
from .._retry import Retries
from ._log_names import describe, logger
from ._settings import SourceSettings
from ._state import SourceState

DEAD_LETTER_HEADERS = (
    "leaseworker.error",
    "leaseworker.error.detail",
    "leaseworker.original.topic",
    "leaseworker.original.partition",
    "leaseworker.original.offset",
    "leaseworker.pod",
)
"""Headers added to a dead-lettered record, after the original record's own headers."""

DEAD_LETTER_FAILURE_HEADERS = ("leaseworker.error.type", "leaseworker.job.key")
"""Headers added after :data:`DEAD_LETTER_HEADERS` when the job failed or timed out."""

DEAD_LETTER_LOSS_HEADERS = ("leaseworker.loss.reason",)
"""Header added after the failure headers for ``lost_repeatedly``: the last loss's reason."""

DEAD_LETTER_OMITTED = "leaseworker.omitted"
"""Header of a dead letter too large to send whole: what was left out (``value``, ``headers``)."""

Headers = list[tuple[str, bytes | None]]

SendDeadLetter = Callable[[Any, bytes | None, Headers], Awaitable[object]]
"""Send (key, value, headers) to the dead-letter topic (the producer's ``send_and_wait``)."""


@final
class DeadLetters:
    """Log malformed records; copy them and failed triggers through ``send``.

    Without ``settings.dead_letter_topic`` records are only logged.
    """

    def __init__(
        self,
        settings: SourceSettings,
        state: SourceState,
        send: SendDeadLetter,
        *,
        backoff: Backoff,
    ) -> None:
        self._settings = settings
        self._state = state
        self._stats = state.stats
        self._send = send
        self._backoff = backoff

    def malformed(self, record: Any, exc: MalformedTrigger) -> None:
        """Log a malformed record: reason and position, never its contents."""
        self._stats.malformed += 1
        logger.warning(
            "malformed trigger %s[%d]@%d: %s",
            record.topic,
            record.partition,
            record.offset,
            exc,
            extra={
                "event": "malformed",
                "pod": self._settings.pod,
                "reason": exc.reason,
                "topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
            },
        )
        self._state.event("malformed", record=record, reason=exc.reason)

    async def send(
        self,
        record: Any,
        reason: DeadLetterReason,
        detail: str,
        *,
        failure: tuple[str, str] | None = None,
        loss: tuple[str] | tuple[()] = (),
    ) -> None:
        """Copy ``record`` to the dead-letter topic, if one is set (retried until it succeeds).

        ``failure`` is the (error type, job key) of a trigger whose job ended
        it (failed, timed out, lost repeatedly, a bad result); ``loss`` the
        last loss reason of one given up as ``lost_repeatedly``.
        """
        if not self._settings.dead_letter_topic:
            return
        position = (record.topic, str(record.partition), str(record.offset), self._settings.pod)
        added = [
            *zip(DEAD_LETTER_HEADERS, (reason, detail, *position), strict=True),
            *(zip(DEAD_LETTER_FAILURE_HEADERS, failure, strict=True) if failure else ()),
            *(zip(DEAD_LETTER_LOSS_HEADERS, loss, strict=True) if loss else ()),
        ]
        # What is sent, most complete first: when the copy is too large for the
        # producer or the topic, the payload, then the original headers are left
        # out (the record itself stays in its topic, at the coordinates above).
        copies = _copies(record, [(name, value.encode()) for name, value in added])
        value, headers, _ = next(copies)
        retries = Retries(self._backoff)
        while True:
            try:
                with anyio.fail_after(self._settings.kafka_timeout):
                    await self._send(record.key, value, headers)
            except MessageSizeTooLargeError as err:
                smaller = next(copies, None)
                if smaller is not None:
                    value, headers, omitted = smaller
                    self._trimmed(record, err, omitted)
                    continue
                await retries.wait(functools.partial(self._failed, record, err))
                continue
            except (KafkaError, TimeoutError) as err:
                await retries.wait(functools.partial(self._failed, record, err))
                continue
            self._sent(record, reason)
            return

    def _sent(self, record: Any, reason: DeadLetterReason) -> None:
        self._stats.dead_letters += 1
        self._state.event("dead_lettered", record=record, reason=reason)
        logger.info(
            "dead-lettered %s[%d]@%d: %s",
            record.topic,
            record.partition,
            record.offset,
            reason,
            extra={"event": "dead_lettered", "pod": self._settings.pod, "reason": reason},
        )

    def _trimmed(self, record: Any, err: BaseException, omitted: str) -> None:
        logger.warning(
            "dead letter of %s[%d]@%d is too large (%s); sending it without its %s",
            record.topic,
            record.partition,
            record.offset,
            describe(err),
            omitted.replace(",", " and "),
            extra={"event": "dead_letter_trimmed", "pod": self._settings.pod},
        )

    def _failed(self, record: Any, err: BaseException, delay: float, attempt: int) -> None:
        """Log a failed dead-letter send, retried in ``delay`` seconds.

        A retriable error (the broker is away, a leader moves) is a warning; one
        that only an operator can fix (authorisation, a missing or invalid
        topic) is an error, and is retried too, so the record is never dropped.
        """
        retriable = isinstance(err, TimeoutError) or getattr(err, "retriable", False)
        logger.log(
            logging.WARNING if retriable else logging.ERROR,
            "dead-lettering %s[%d]@%d failed (%s); retrying in %.1fs",
            record.topic,
            record.partition,
            record.offset,
            describe(err),
            delay,
            extra={"event": "dead_letter_failed", "pod": self._settings.pod},
        )


_Copy = tuple[bytes | None, Headers, str]
"""A dead letter's value, its headers, and what it leaves out of the record (``""``: nothing)."""


def _copies(record: Any, added: list[tuple[str, bytes]]) -> Iterator[_Copy]:
    """Yield the dead-letter copies of ``record``, most complete first.

    The whole record with ``added``; then without its value; then without its
    own headers either. The smaller copies name what they left out in
    :data:`DEAD_LETTER_OMITTED`. A header without a value stays without one.
    """
    own: Headers = list(record.headers or ())
    yield record.value, [*own, *added], ""
    if record.value is not None:
        yield None, [*own, *added, (DEAD_LETTER_OMITTED, b"value")], "value"
    if own:
        omitted = "headers" if record.value is None else "value,headers"
        yield None, [*added, (DEAD_LETTER_OMITTED, omitted.encode())], omitted
