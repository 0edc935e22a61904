"""A full pod's next poll waits for several free slots; a pod below its limit polls at once.

Fake consumer, gated jobs, the gathering window widened so that only the
slots decide when the poll goes (no timing in the assertions).
"""

from __future__ import annotations

import functools

import anyio
import pytest
from aiokafka import TopicPartition  # type: ignore[import-untyped]

from leaseworker import PodConfig
from leaseworker._execution import Ending, Trigger
from leaseworker._kafka import KafkaTriggerSource, _trigger_source
from leaseworker._worker import TriggerWay

from ..fake_kafka import FakeConsumer, Handled
from ..worker_util import Progress

pytestmark = pytest.mark.fake

TP = TopicPartition("t", 0)


class Gates:
    """One gate per record offset: a job runs until its gate opens."""

    def __init__(self) -> None:
        self._gates: dict[int, anyio.Event] = {}

    def gate(self, offset: int) -> anyio.Event:
        """Return the gate of the record at ``offset``."""
        return self._gates.setdefault(offset, anyio.Event())

    async def handle(self, trigger: Trigger, key: str) -> Ending:
        """Run until the record's gate opens."""
        await self.gate(trigger.offset).wait()
        return Ending("completed")


def _finished(source: KafkaTriggerSource, count: int) -> bool:
    return source.stats.finished == count


def _source_of(consumer: FakeConsumer, gates: Gates, progress: Progress) -> KafkaTriggerSource:
    return KafkaTriggerSource(
        PodConfig(concurrency=4),
        topic="t",
        resolve_key=lambda t: f"k{t.offset}",
        consumer_factory=consumer.factory,
        hooks=[progress],
    )


async def test_a_full_pods_next_poll_carries_the_records_of_three_freed_slots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Concurrency 4, full: the slots freed one at a time refill in one poll of three."""
    monkeypatch.setattr(_trigger_source, "GATHER_WINDOW", 60.0)
    consumer, gates, progress = FakeConsumer(), Gates(), Progress()
    source = _source_of(consumer, gates, progress)
    consumer.add(TP, 4)
    async with anyio.create_task_group() as tg:
        await tg.start(TriggerWay(source, Handled(gates.handle)).run)
        await consumer.assign({TP})
        await progress.until(lambda: source.stats.in_flight == 4, timeout=5)
        consumer.add(TP, 3)
        polls = source.stats.polls
        for offset in range(3):
            gates.gate(offset).set()
            await progress.until(functools.partial(_finished, source, offset + 1), timeout=5)
        await progress.until(lambda: source.stats.in_flight == 4, timeout=5)
        assert source.stats.polls == polls + 1  # the three records came in one poll
        for offset in range(3, 7):
            gates.gate(offset).set()
        await progress.until(lambda: source.stats.finished == 7, timeout=5)
        source.stop()
    assert consumer.commits[-1] == {TP: 7}


async def test_a_pod_below_its_limit_polls_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """One job running of four slots: a new record starts without waiting to gather."""
    monkeypatch.setattr(_trigger_source, "GATHER_WINDOW", 60.0)
    consumer, gates, progress = FakeConsumer(), Gates(), Progress()
    source = _source_of(consumer, gates, progress)
    consumer.add(TP, 1)
    async with anyio.create_task_group() as tg:
        await tg.start(TriggerWay(source, Handled(gates.handle)).run)
        await consumer.assign({TP})
        await progress.until(lambda: source.stats.in_flight == 1, timeout=5)
        consumer.add(TP, 1)
        await progress.until(lambda: source.stats.in_flight == 2, timeout=5)
        for offset in range(2):
            gates.gate(offset).set()
        await progress.until(lambda: source.stats.finished == 2, timeout=5)
        source.stop()
    assert consumer.commits[-1] == {TP: 2}
