"""What the Kafka source does with its records and partitions: one :class:`SourceEvent` per step.

The Kafka layer builds these; telemetry (spans, metrics) and tests' waits
subscribe to them as hooks. Records are aiokafka's ``ConsumerRecord`` and
partitions its ``TopicPartition``, typed ``Any`` here: this box imports no
Kafka client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .._outcome import DeadLetterReason, MalformedReason
from ._identity import Trigger

SourceEventName = Literal[
    "joining",
    "assigned",
    "revoking",
    "revoked",
    "polled",
    "paused",
    "waiting",
    "processing",
    "received",
    "processed",
    "malformed",
    "dead_lettered",
    "commit_checked",
    "committed",
    "stopping",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceEvent:
    """One step of the Kafka source; fields that do not apply are ``None``.

    ``joining``: the consumer is built and joins its group; ``assigned``
    (``partitions``); ``revoking``: a rebalance takes partitions away; ``revoked``
    (``topic``, ``partition``): one of them is gone, forget what is pending on
    it; ``polled``: a fetch returned; ``paused``: partitions were paused or
    resumed (``paused`` says which way); ``waiting``: what start-up waits for
    changed (``reason``, ``None`` when nothing); ``processing``: ``record``'s
    processing begins (executions run between this and ``processed``, in the
    same task); ``received``: ``record`` decoded to ``trigger`` for
    ``job_key``; ``processed``: its processing ended (``error``: the exception
    that ended it, a cancellation included); ``malformed`` (``reason``): it
    cannot become a job; ``dead_lettered`` (``reason``): it was copied to the
    dead-letter topic; ``commit_checked``: the committer looked at what
    finished; ``committed``: a commit of ``offsets`` (topic-partition -> next
    position) begun at ``began`` (anyio's clock) returned (failed: ``error``;
    ``rejected``: the group refused it, the partitions belong to another
    member); ``stopping``: the source was told to stop.
    """

    name: SourceEventName
    record: Any = None
    trigger: Trigger | None = None
    job_key: str | None = None
    reason: MalformedReason | DeadLetterReason | str | None = None
    offsets: Mapping[Any, int] | None = None
    began: float | None = None
    error: BaseException | None = None
    rejected: bool = False
    paused: bool | None = None
    topic: str | None = None
    partition: int | None = None
    partitions: tuple[Any, ...] = ()
