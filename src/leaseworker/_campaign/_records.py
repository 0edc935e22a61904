"""What a fault campaign knows besides the pods' history, as plain values for the checker.

The campaign fills a :class:`Records` from its own bookkeeping (the triggers
it produced, the pods it killed and how each pod exited) and from the systems
themselves after the run (the group's committed offsets read from Kafka, the
dead letters read from their topic, the completions read from the store), so
the checker judges the history against independent witnesses.
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
class Records:
    """The campaign's records; ``committed`` maps a partition to its committed position."""

    produced: tuple[Produced, ...] = ()
    committed: Mapping[int, int] = field(default_factory=dict)
    dead_letters: tuple[DeadLetter, ...] = ()
    completions: Mapping[tuple[str, str], Stored] = field(default_factory=dict)
    exits: tuple[PodExit, ...] = ()
