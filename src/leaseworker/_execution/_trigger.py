"""Triggers: the Kafka records that ask for a job, decoded and validated.

This module knows the *shape* of a trigger, not Kafka: the source hands it
plain bytes and numbers, so the decoder can be fuzzed and reused without a
broker. A record that can never become a job (too large, not a JSON object, no
usable job key) raises :class:`~leaseworker.MalformedTrigger` with a reason
code; nothing here ever quotes the payload, which may hold personal data.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from .._errors import MalformedTrigger
from .._events import Trigger as Trigger
from .._store import EFFECT_ID_HEADER

DEFAULT_MAX_PAYLOAD_BYTES = 1 << 20
"""Payloads larger than this (1 MiB) are malformed: a trigger asks for a job, it is not the data."""

MAX_JOB_KEY_LENGTH = 256
"""Job keys end up in Redis key names and log lines; longer ones are malformed."""


def decode_trigger(
    *,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes]] = (),
    timestamp_ms: int | None = None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> Trigger:
    """Build a :class:`Trigger` from a raw record or raise :class:`MalformedTrigger`.

    The size check comes first, so an oversized record is never parsed. JSON
    must decode to an object; ``NaN``/``Infinity`` and nesting deep enough to
    exhaust the parser are malformed too, never a crash.
    """
    size = len(value or b"")
    if size > max_payload_bytes:
        raise MalformedTrigger("too_large", f"payload is {size} bytes, limit {max_payload_bytes}")
    raw = value or b""
    try:
        # What json.loads does with bytes, with one decoder built once, not per call.
        payload = _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, huge ints
        raise MalformedTrigger("not_json", _json_problem(exc)) from None
    if not isinstance(payload, dict):
        raise MalformedTrigger("not_object", f"payload is a JSON {_json_type(payload)}")
    try:
        text_key = None if key is None else key.decode()
    except UnicodeDecodeError:
        raise MalformedTrigger("bad_key", "record key is not valid UTF-8") from None
    return Trigger(
        topic=topic,
        partition=partition,
        offset=offset,
        key=text_key,
        headers=tuple(headers),
        timestamp=_timestamp(timestamp_ms),
        payload=payload,
    )


def default_job_key(trigger: Trigger) -> str:
    """Return the effect id, else the record key, else the payload's ``jobId``; or raise.

    A record the outbox relay sent carries ``leaseworker-effect-id``: keyed by
    it, a job consuming an effects topic completes each effect once.
    """
    for name, value in trigger.headers:
        if name == EFFECT_ID_HEADER and value:
            return value.decode("utf-8", "replace")
    if trigger.key:
        return trigger.key
    job_id = trigger.payload.get("jobId")
    if isinstance(job_id, str) and job_id:
        return job_id
    raise MalformedTrigger("no_job_key", "no record key and no string 'jobId' in the payload")


def check_job_key(key: object) -> str:
    """Return ``key`` if it can name a lease, else raise :class:`MalformedTrigger`.

    A job key becomes a Redis Cluster hash tag (``{<job key>}``), so braces
    would split a job's lease and fence keys across slots; control characters
    would forge log lines; a key of whitespace only is refused too.
    """
    if not isinstance(key, str) or not key:
        raise MalformedTrigger(
            "no_job_key", f"job key must be a non-empty string, got {_kind(key)}"
        )
    if len(key) > MAX_JOB_KEY_LENGTH:
        raise MalformedTrigger("bad_job_key", f"job key is longer than {MAX_JOB_KEY_LENGTH}")
    if "{" in key or "}" in key or not key.isprintable():
        raise MalformedTrigger("bad_job_key", "job key holds braces or unprintable characters")
    if not key.strip():  # it would name a lease nobody can read in a log line
        raise MalformedTrigger("bad_job_key", "job key is only whitespace")
    return key


def resolve_job_key(job_key: Callable[[Trigger], str], trigger: Trigger) -> str:
    """Return the checked key ``job_key(trigger)`` gives, as a pod resolves it.

    Raises :class:`MalformedTrigger`: the one ``job_key`` raised, or
    ``job_key_error`` (naming only the exception's type) for any other
    exception, or what :func:`check_job_key` says about the key.
    """
    try:
        key = job_key(trigger)
    except MalformedTrigger:
        raise
    except Exception as exc:
        raise MalformedTrigger("job_key_error", f"job_key() raised {type(exc).__name__}") from exc
    return check_job_key(key)


def _reject_constant(name: str) -> object:
    raise _NotJson(f"{name} is not valid JSON")


class _NotJson(ValueError):
    """``NaN``, ``Infinity`` or ``-Infinity``: Python's parser takes them, JSON does not."""


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _json_problem(exc: BaseException) -> str:
    if isinstance(exc, json.JSONDecodeError):
        # msg/pos only: exc.doc is the payload itself.
        return f"{exc.msg} at byte {exc.pos}"
    if isinstance(exc, RecursionError):
        return "nesting too deep"
    if isinstance(exc, _NotJson):
        return str(exc)  # names the constant only
    return type(exc).__name__


def _json_type(value: object) -> str:
    names = {list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def _kind(value: object) -> str:
    return "an empty string" if value == "" else type(value).__name__


def _timestamp(timestamp_ms: int | None) -> datetime | None:
    if timestamp_ms is None or timestamp_ms < 0:
        return None
    try:
        return datetime.fromtimestamp(timestamp_ms / 1000, tz=UTC)
    except (OverflowError, OSError, ValueError):  # beyond year 9999: not a real timestamp
        return None
