"""A stand-in aiokafka consumer for fake tests, passed to a source as its consumer_factory.

It keeps what a broker would (records per partition, this member's
assignment, its pause flags) in memory, answers the calls the source makes,
and lets a test drive rebalances: :meth:`FakeConsumer.assign` drops the pause
flags as aiokafka does and awaits the source's listener, as aiokafka does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from aiokafka import TopicPartition  # type: ignore[import-untyped]

from leaseworker._execution import Ending, Prepared, Trigger
from leaseworker._kafka import SourceSettings


@dataclass(frozen=True)
class FakeRecord:
    """A consumer record: the attributes the source reads."""

    topic: str
    partition: int
    offset: int
    key: bytes | None = b"k"
    value: bytes | None = b"{}"
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    timestamp: int | None = None


class FakeConsumer:
    """An in-memory consumer: ``add`` records, ``assign`` partitions, read ``commits``."""

    def __init__(self) -> None:
        self.listener: Any = None
        self.commits: list[dict[Any, int]] = []
        self._assigned: set[Any] = set()
        self._paused: set[Any] = set()
        self._records: dict[Any, list[FakeRecord]] = {}
        self._position: dict[Any, int] = {}
        self._changed = anyio.Event()

    def factory(self, settings: SourceSettings, topic: str) -> FakeConsumer:
        """Be the source's consumer (a :data:`ConsumerFactory`)."""
        return self

    def add(self, tp: Any, count: int) -> None:
        """Append ``count`` records to partition ``tp``."""
        records = self._records.setdefault(tp, [])
        for _ in range(count):
            records.append(FakeRecord(tp.topic, tp.partition, len(records)))
        self._wake()

    async def assign(self, partitions: set[Any]) -> None:
        """Rebalance this member onto ``partitions``: pause flags are forgotten."""
        self._assigned = set(partitions)
        self._paused = set()
        await self.listener.on_partitions_assigned(set(partitions))
        self._wake()

    # -- the calls the source makes ----------------------------------------------

    def subscribe(self, topics: list[str], *, listener: Any) -> None:
        """Remember the rebalance listener."""
        self.listener = listener

    async def start(self) -> None:
        """Start at once (the broker is always there)."""

    async def stop(self) -> None:
        """Stop at once."""

    async def getmany(self, *, timeout_ms: int, max_records: int) -> dict[Any, list[FakeRecord]]:
        """Return up to ``max_records`` records of unpaused partitions, waiting for some."""
        with anyio.move_on_after(timeout_ms / 1000):
            while not (batch := self._take(max_records)):
                changed = self._changed
                await changed.wait()
            return batch
        return {}

    def seek(self, tp: Any, offset: int) -> None:
        """Read ``tp`` from ``offset`` on."""
        self._position[tp] = offset

    def assignment(self) -> set[Any]:
        """Return the partitions assigned now."""
        return set(self._assigned)

    def paused(self) -> set[Any]:
        """Return the partitions paused now."""
        return set(self._paused)

    def pause(self, *partitions: Any) -> None:
        """Pause ``partitions``."""
        self._paused |= set(partitions)

    def resume(self, *partitions: Any) -> None:
        """Resume ``partitions``."""
        self._paused -= set(partitions)
        self._wake()

    async def commit(self, offsets: dict[Any, int]) -> None:
        """Record the commit."""
        self.commits.append(dict(offsets))

    def _take(self, limit: int) -> dict[Any, list[FakeRecord]]:
        batch: dict[Any, list[FakeRecord]] = {}
        for tp in sorted(self._assigned - self._paused):
            start = self._position.get(tp, 0)
            records = self._records.get(tp, [])[start : start + limit]
            if records:
                batch[tp] = records
                self._position[tp] = start + len(records)
                limit -= len(records)
        return batch

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()


__all__ = ["FakeConsumer", "FakeRecord", "TopicPartition"]


class Handled:
    """An executor stand-in for a source's tests: each trigger goes to ``handle`` alone.

    No store and no lease: the way's line-up by job key still applies.
    """

    def __init__(self, handle: Callable[[Trigger, str], Awaitable[Ending]]) -> None:
        self._handle = handle

    def prepare(self, items: Sequence[tuple[Trigger, str]]) -> list[Prepared]:
        """Nothing to look up: every trigger is ready."""
        return [Prepared("") for _ in items]

    async def run(self, trigger: Trigger, job_key: str, prepared: Prepared | None = None) -> Ending:
        """Run ``handle``."""
        return await self._handle(trigger, job_key)
