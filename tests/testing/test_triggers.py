"""Test triggers come from the pod's decoder; raw records resolve their job key as a pod does."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from leaseworker import JobContext, MalformedTrigger, ReportJob, Trigger
from leaseworker.testing import decode_record, make_trigger


class _Keyed(ReportJob):
    topic = "reports"

    def job_key(self, trigger: Trigger) -> str:
        return f"report:{trigger.payload['tenant']}"  # KeyError on a bad request: the job's bug

    async def run(self, ctx: JobContext) -> object:
        return None


def test_make_trigger_builds_what_a_pod_would() -> None:
    """Payload through JSON, the key and text headers encoded, the position kept."""
    when = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    trigger = make_trigger(
        {"tenant": "acme", "n": (1, 2)},
        key="k",
        topic="t",
        partition=2,
        offset=7,
        headers={"traceparent": "00-ab"},
        timestamp=when,
    )
    assert trigger.payload == {"tenant": "acme", "n": [1, 2]}  # JSON: a tuple arrives as a list
    assert (trigger.key, trigger.topic, trigger.partition, trigger.offset) == ("k", "t", 2, 7)
    assert trigger.headers == (("traceparent", b"00-ab"),)
    assert trigger.timestamp == when


def test_make_trigger_refuses_what_json_cannot_carry() -> None:
    """A payload no producer could send fails in the test, not later."""
    with pytest.raises(ValueError, match="JSON"):
        make_trigger({"x": float("nan")})


def test_decode_record_resolves_the_job_key_on_the_jobs_topic() -> None:
    """Raw bytes in, the trigger and its key out, on the job's topic by default."""
    trigger, key = decode_record(_Keyed(), b'{"tenant": "acme"}', headers=[("h", b"v")])
    assert key == "report:acme"
    assert trigger.topic == "reports"
    assert trigger.headers == (("h", b"v"),)


@pytest.mark.parametrize(
    ("value", "key", "reason"),
    [
        (b"[1]", None, "not_object"),
        (b"{", None, "not_json"),
        (b"{}", None, "job_key_error"),  # job_key() raised KeyError
        (b'{"tenant": "a{b"}', None, "bad_job_key"),
        (b'{"tenant": "acme"}', b"\xff", "bad_key"),
        (b"x" * 20, None, "too_large"),
    ],
)
def test_decode_record_gives_the_pods_dead_letter_reason(
    value: bytes, key: bytes | None, reason: str
) -> None:
    """Each malformed record raises MalformedTrigger with the reason a pod dead-letters it with."""
    with pytest.raises(MalformedTrigger) as malformed:
        decode_record(_Keyed(), value, key=key, max_payload_bytes=19)
    assert malformed.value.reason == reason
