"""The offset commit's barrier: no offset reaches Kafka before the store made its ends last."""

from __future__ import annotations

import anyio
import pytest
from aiokafka import TopicPartition  # type: ignore[import-untyped]

from leaseworker import PodConfig, StoreUnavailable
from leaseworker._kafka import Partition
from leaseworker._kafka._commits import Commits
from leaseworker._kafka._state import SourceState


class _Consumer:
    """A stand-in consumer recording what it was asked to commit (fake)."""

    def __init__(self) -> None:
        self.sent: list[dict[TopicPartition, int]] = []

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.sent.append(dict(offsets))


class _Disk:
    """A store barrier held until ``release()``: a stand-in for the WAL's fsync (fake)."""

    def __init__(self) -> None:
        self.entered = anyio.Event()
        self.released = anyio.Event()
        self.error: Exception | None = None
        self.calls = 0

    async def durable(self) -> None:
        self.calls += 1
        self.entered.set()
        await self.released.wait()
        if self.error is not None:
            raise self.error


def _finished(part: Partition, *offsets: int) -> None:
    for offset in offsets:
        part.tracker.add(offset)
        part.tracker.done(offset)


@pytest.mark.fake
async def test_no_offset_is_sent_before_the_barrier_returns() -> None:
    """Invariant: Kafka is told nothing until the store's barrier covers the finished offsets.

    Offsets that finish while the barrier waits are not in this commit (the
    barrier began after it read them) but in the next one, behind a barrier
    of its own.
    """
    consumer, disk, state = _Consumer(), _Disk(), SourceState()
    commits = Commits(state, PodConfig(), consumer.commit, disk.durable)
    part = Partition(TopicPartition("t", 0))
    _finished(part, 0, 1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(commits.commit, [part])
        await anyio.wait_all_tasks_blocked()
        assert disk.entered.is_set()
        assert consumer.sent == []  # the fsync has not returned: nothing committed
        _finished(part, 2)  # ends while the fsync runs
        disk.released.set()
    assert consumer.sent == [{TopicPartition("t", 0): 2}]
    assert await commits.commit([part])
    assert consumer.sent[-1] == {TopicPartition("t", 0): 3}
    assert disk.calls == 2


@pytest.mark.fake
async def test_a_failed_barrier_fails_the_commit_and_sends_nothing() -> None:
    """The store could not make the ends last: the commit is retried later, never sent unsynced."""
    consumer, disk, state = _Consumer(), _Disk(), SourceState()
    commits = Commits(state, PodConfig(), consumer.commit, disk.durable)
    part = Partition(TopicPartition("t", 0))
    _finished(part, 0)
    disk.error = StoreUnavailable(None, "OSError: fsync of the store's WAL failed")
    disk.released.set()
    assert not await commits.commit([part])
    assert consumer.sent == []
    assert (state.stats.commit_errors, state.stats.commits) == (1, 0)
    assert part.tracker.committable() == 1  # still to commit
    disk.error = None
    assert await commits.commit([part])
    assert consumer.sent == [{TopicPartition("t", 0): 1}]


@pytest.mark.fake
async def test_a_barrier_that_never_returns_is_bounded_by_commit_timeout() -> None:
    """A stuck fsync counts against ``commit_timeout`` like a stuck broker: failed, not hung."""
    consumer, disk, state = _Consumer(), _Disk(), SourceState()
    commits = Commits(state, PodConfig(commit_timeout=0.2), consumer.commit, disk.durable)
    part = Partition(TopicPartition("t", 0))
    _finished(part, 0)
    with anyio.fail_after(5):
        assert not await commits.commit([part])
    assert consumer.sent == []
    assert state.stats.commit_errors == 1
