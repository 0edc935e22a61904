"""What a fault campaign knows besides the pods' history, as plain values for the checker.

The campaign fills a :class:`Records` from its own bookkeeping (the triggers
it produced, the pods it killed and how each pod exited) and from the systems
themselves after the run (the group's committed offsets read from Kafka, the
dead letters read from their topic, the completions read from the store), so
the checker judges the history against independent witnesses. The effects'
witnesses: the outbox rows read from the store's table, every record the
campaign's receiver consumed from the effects topics, what its inbox let it
process, and the store's audit of claims taken on messages already sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, kw_only=True)
class Produced:
    """One trigger the campaign sent: where it landed and the identity it asks for."""

    partition: int
    offset: int
    job_key: str
    input_version: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetter:
    """One record read back from the dead-letter topic (its headers, decoded)."""

    partition: int
    offset: int
    reason: str
    job_key: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Stored:
    """The completion the store holds for one identity."""

    fence: int
    execution_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PodExit:
    """How one pod process ended; ``killed`` when the campaign SIGKILLed it on purpose."""

    pod: str
    code: int | None
    killed: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Outboxed:
    """One message committed to the outbox: its identity, fence and times (Unix seconds).

    ``job_key`` is the user's job key (not the store's ``{namespace}:{...}``);
    ``sent`` is when a relay marked it sent (``None``: never).
    """

    effect_id: str
    job_key: str
    input_version: str
    fence: int
    topic: str
    committed: float
    sent: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    """One record the campaign's receiver consumed, and what its inbox said of it.

    ``effect_id`` is ``None`` for a record without leaseworker's headers;
    ``created`` is the record's timestamp (the producer's clock when the relay
    sent it), ``received`` when the receiver read it, both Unix seconds.
    """

    effect_id: str | None
    fence: int
    status: str
    topic: str
    partition: int
    offset: int
    created: float
    received: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Reclaim:
    """A claim a relay took on a message already marked sent (the store's audit saw it)."""

    effect_id: str
    relay: str | None
    at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Marked:
    """The marks one process left for one execution: how many, the first and the last.

    Marks are ``time.monotonic()`` readings a job's child process (or that
    child's own child) wrote while it computed (``leaseworker_dev._services.crunch``).
    """

    execution_id: str
    pid: int
    count: int
    first: float
    last: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Records:
    """The campaign's records; ``committed`` maps a partition to its committed position.

    ``processed`` counts, per effect id, the receiver's own effect rows (what
    its inbox let through); ``reclaims`` the claims taken on messages already
    sent (``None``: not audited); ``wall_offset`` is
    ``time.time() - time.monotonic()`` during the campaign, to place the
    effects' Unix times among the faults' monotonic ones; ``marks`` when each
    process of an execution last ran code, where the job left marks;
    ``receiver_errors`` the consumer errors that ended a receiver's life.
    """

    produced: tuple[Produced, ...] = ()
    committed: Mapping[int, int] = field(default_factory=dict)
    dead_letters: tuple[DeadLetter, ...] = ()
    completions: Mapping[tuple[str, str], Stored] = field(default_factory=dict)
    exits: tuple[PodExit, ...] = ()
    outbox: tuple[Outboxed, ...] = ()
    deliveries: tuple[Delivery, ...] = ()
    processed: Mapping[str, int] = field(default_factory=dict)
    reclaims: tuple[Reclaim, ...] | None = ()
    wall_offset: float = 0.0
    marks: tuple[Marked, ...] = ()
    receiver_errors: tuple[str, ...] = ()
