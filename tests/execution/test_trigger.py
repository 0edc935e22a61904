"""Decoding triggers: valid records become Triggers; everything else is MalformedTrigger."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leaseworker import MalformedTrigger, Trigger
from leaseworker._execution import check_job_key, decode_trigger
from leaseworker._execution._trigger import default_job_key

pytestmark = pytest.mark.fake

REASONS = {"too_large", "not_json", "not_object", "bad_key", "no_job_key", "bad_job_key"}


def _decode(value: bytes | None, key: bytes | None = b"k", **kwargs: Any) -> Trigger:
    return decode_trigger(topic="t", partition=1, offset=7, key=key, value=value, **kwargs)


def test_a_json_object_becomes_a_trigger_with_every_field() -> None:
    """Topic, partition, offset, key, headers, timestamp and payload come through."""
    trigger = _decode(
        b'{"jobId": "j", "n": 1}', headers=[("h", b"v")], timestamp_ms=1_700_000_000_000
    )
    assert (trigger.topic, trigger.partition, trigger.offset, trigger.key) == ("t", 1, 7, "k")
    assert trigger.headers == (("h", b"v"),)
    assert trigger.timestamp is not None
    assert trigger.timestamp.year == 2023
    assert dict(trigger.payload) == {"jobId": "j", "n": 1}


@pytest.mark.parametrize(
    ("value", "key", "reason"),
    [
        (b"{", b"k", "not_json"),
        (b"", b"k", "not_json"),
        (None, b"k", "not_json"),
        (b"\xff\xfe\x00", b"k", "not_json"),
        (b'{"x": NaN}', b"k", "not_json"),
        (b"[1, 2]", b"k", "not_object"),
        (b'"text"', b"k", "not_object"),
        (b"{}", b"\xff", "bad_key"),
        (b"[" * 100_000 + b"]" * 100_000, b"k", "too_large"),
    ],
)
def test_malformed_records_carry_a_reason_code(
    value: bytes | None, key: bytes, reason: str
) -> None:
    """Each kind of bad record is named, so dead-letter headers and dashboards can group them."""
    with pytest.raises(MalformedTrigger) as bad:
        _decode(value, key, max_payload_bytes=1000)
    assert bad.value.reason == reason


def test_deep_nesting_is_malformed_not_a_crash() -> None:
    """Nesting that exhausts the parser's recursion is a reason code, not a RecursionError."""
    deep = b"[" * 200_000 + b"]" * 200_000
    with pytest.raises(MalformedTrigger) as bad:
        _decode(deep, max_payload_bytes=1 << 20)
    assert bad.value.reason == "not_json"


def test_error_messages_never_quote_the_payload() -> None:
    """A payload may hold personal data; the error text names the problem only."""
    with pytest.raises(MalformedTrigger) as bad:
        _decode(b'{"email": "alice@example.com", oops}')
    assert "alice" not in str(bad.value)


def test_the_default_job_key_is_the_record_key_else_the_payload_job_id() -> None:
    """Record key first, then payload jobId; neither means no_job_key."""
    assert default_job_key(_decode(b'{"jobId": "j"}')) == "k"
    assert default_job_key(_decode(b'{"jobId": "j"}', key=None)) == "j"
    for value in (b"{}", b'{"jobId": 3}', b'{"jobId": ""}'):
        with pytest.raises(MalformedTrigger) as bad:
            default_job_key(_decode(value, key=None))
        assert bad.value.reason == "no_job_key"


@pytest.mark.parametrize("key", ["", "a{b}", "x" * 257, "line\nbreak", 5, None])
def test_job_keys_that_cannot_name_a_lease_are_rejected(key: object) -> None:
    """Braces would split the Redis hash tag; control characters would forge log lines."""
    with pytest.raises(MalformedTrigger) as bad:
        check_job_key(key)
    assert bad.value.reason in {"no_job_key", "bad_job_key"}


@pytest.mark.parametrize("key", [" ", "   "])
def test_a_job_key_of_whitespace_only_is_a_bad_job_key(key: str) -> None:
    """A blank key would name a lease and a log line nobody can read: malformed, not run."""
    with pytest.raises(MalformedTrigger) as bad:
        check_job_key(key)
    assert bad.value.reason == "bad_job_key"
    assert "whitespace" in bad.value.detail
    assert check_job_key(" a ") == " a "  # surrounding spaces alone are kept


@settings(max_examples=300)
@given(st.binary(max_size=300), st.one_of(st.none(), st.binary(max_size=20)))
def test_random_bytes_decode_or_raise_malformed_trigger(value: bytes, key: bytes | None) -> None:
    """Fuzz: arbitrary bytes never raise anything but MalformedTrigger."""
    reason = None
    try:
        trigger = _decode(value, key, max_payload_bytes=200)
    except MalformedTrigger as exc:
        reason = exc.reason
    else:
        assert isinstance(trigger.payload, dict)
    assert reason is None or reason in REASONS


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300)
@given(_json)
def test_random_json_decodes_to_a_trigger_exactly_when_it_is_an_object(value: object) -> None:
    """Fuzz: any JSON value decodes iff it is an object, and the payload round-trips."""
    raw = json.dumps(value).encode()
    if isinstance(value, dict):
        assert dict(_decode(raw).payload) == value
    else:
        with pytest.raises(MalformedTrigger) as bad:
            _decode(raw)
        assert bad.value.reason == "not_object"
