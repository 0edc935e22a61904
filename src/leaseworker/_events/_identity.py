"""Who an event is about: the ``Trigger`` (one Kafka record) and the ``Attempt`` (one execution).

An :class:`Attempt` is made once per execution, by the executor, and every
event of that execution carries it: the trigger, the job key, the input
version, the execution id and the pod, named once instead of passed around.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class Trigger:
    """One Kafka record asking for a job, as the job sees it.

    ``key`` is the record key decoded as UTF-8 (``None`` when the record has
    none); ``headers`` keep Kafka's ``(name, bytes)`` pairs in order;
    ``timestamp`` is the record's timestamp in UTC (``None`` when the producer
    set none); ``payload`` is the decoded JSON object.
    """

    topic: str
    partition: int
    offset: int
    key: str | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: datetime | None
    payload: Mapping[str, Any]

    def __repr__(self) -> str:
        # Payloads may hold personal data; reprs end up in logs and tracebacks.
        return (
            f"Trigger(topic={self.topic!r}, partition={self.partition}, "
            f"offset={self.offset}, key={self.key!r})"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """One execution of a job key: the identity every event of that execution carries.

    ``input_version`` is ``None`` when the trigger's version could not be read
    (the trigger fails before any execution runs); ``execution_id`` is new per
    attempt; ``pod`` is the worker instance running it.
    """

    trigger: Trigger
    job_key: str
    input_version: str | None
    execution_id: str
    pod: str
