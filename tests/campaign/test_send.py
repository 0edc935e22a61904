"""The campaign records each trigger it sends under the job key a pod resolves for it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from leaseworker import JobContext, ReportJob, Trigger
from leaseworker_dev._campaign._campaign_run import _send


@dataclass
class _Landed:
    partition: int
    offset: int


class _Producer:
    """Stands in for AIOKafkaProducer: every record lands at the next offset of partition 0."""

    def __init__(self) -> None:
        self.sent = 0

    async def send_and_wait(self, topic: str, *, key: bytes | None, value: bytes) -> _Landed:
        self.sent += 1
        return _Landed(partition=0, offset=self.sent - 1)


class _Keyed(ReportJob):
    topic = "reports"

    def job_key(self, trigger: Trigger) -> str:
        return str(trigger.payload["key"])

    def input_version(self, trigger: Trigger) -> str:
        return "v1"

    async def run(self, ctx: JobContext) -> object:
        return None


@pytest.mark.parametrize(
    ("payload", "job_key", "version"),
    [
        ({"key": "report:acme"}, "report:acme", "v1"),
        ({"key": "   "}, "", ""),  # whitespace only: the pods dead-letter it (bad_job_key)
        ({}, "", ""),  # job_key() raises KeyError: the pods dead-letter it (job_key_error)
    ],
)
async def test_a_sent_trigger_is_recorded_under_the_pods_job_key(
    payload: dict[str, Any], job_key: str, version: str
) -> None:
    """A key the pods refuse is recorded as no identity, not raised out of the campaign."""
    produced = await _send(_Producer(), _Keyed(), None, payload)
    assert (produced.partition, produced.offset) == (0, 0)
    assert (produced.job_key, produced.input_version) == (job_key, version)
