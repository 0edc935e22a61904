"""Triggers for tests, built by the decoder a pod uses, so a job sees what it would in production.

:func:`make_trigger` turns a payload into JSON and decodes it as a Kafka
record; :func:`decode_record` takes the raw record bytes instead and also
resolves the job key, raising :class:`~leaseworker.MalformedTrigger` with the
reason a pod would dead-letter the record with.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from .._execution import DEFAULT_MAX_PAYLOAD_BYTES, ReportJob, Trigger, decode_trigger
from .._execution import resolve_job_key as _resolve

DEFAULT_TOPIC = "leaseworker.test"
"""The topic of a test trigger when neither the call nor the job names one."""
DEAD_LETTER_SUFFIX = ".dead-letter"
"""The dead-letter topic of the pytest plugin's ``leaseworker_topic`` is its name plus this."""

Headers = Mapping[str, bytes | str] | Sequence[tuple[str, bytes]]
"""Record headers: a mapping, or Kafka's ordered ``(name, bytes)`` pairs."""


def make_trigger(
    payload: Mapping[str, Any],
    *,
    key: str | None = None,
    topic: str = DEFAULT_TOPIC,
    partition: int = 0,
    offset: int = 0,
    headers: Headers | None = None,
    timestamp: datetime | None = None,
) -> Trigger:
    """Return the :class:`~leaseworker.Trigger` a pod would build from this record.

    ::

        trigger = make_trigger({"tenant": "acme", "period": "2026-11"})
        assert MonthlyReport().job_key(trigger) == "report:acme:2026-11"

    ``payload`` goes through JSON and the pod's decoder (``NaN`` or a value
    JSON cannot hold raises ``ValueError``/``TypeError`` here, as the producer
    would have refused it); ``key`` is the record key; ``headers`` values may
    be text (encoded as UTF-8).
    """
    value = json.dumps(payload, allow_nan=False).encode()
    timestamp_ms = None if timestamp is None else int(timestamp.timestamp() * 1000)
    return decode_trigger(
        topic=topic,
        partition=partition,
        offset=offset,
        key=None if key is None else key.encode(),
        value=value,
        headers=_pairs(headers),
        timestamp_ms=timestamp_ms,
        max_payload_bytes=max(DEFAULT_MAX_PAYLOAD_BYTES, len(value)),
    )


def decode_record(
    job: ReportJob,
    value: bytes | None,
    *,
    key: bytes | None = None,
    topic: str | None = None,
    partition: int = 0,
    offset: int = 0,
    headers: Headers | None = None,
    timestamp_ms: int | None = None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> tuple[Trigger, str]:
    """Decode a raw record and resolve its job key exactly as a pod does.

    Returns ``(trigger, job_key)``, or raises :class:`~leaseworker.MalformedTrigger`
    whose ``reason`` is the dead-letter reason (``not_json``, ``no_job_key``,
    ``job_key_error``, ...). ``topic`` defaults to the job's.
    """
    trigger = decode_trigger(
        topic=topic or job.topic or DEFAULT_TOPIC,
        partition=partition,
        offset=offset,
        key=key,
        value=value,
        headers=_pairs(headers),
        timestamp_ms=timestamp_ms,
        max_payload_bytes=max_payload_bytes,
    )
    return trigger, _resolve(job.job_key, trigger)


def _pairs(headers: Headers | None) -> list[tuple[str, bytes]]:
    if headers is None:
        return []
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [(name, value.encode() if isinstance(value, str) else value) for name, value in items]
