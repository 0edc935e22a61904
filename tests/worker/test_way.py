"""The trigger's way without a broker: a poll's triggers lined up by job key, prepared together.

A fake consumer, the in-memory lease store and a job that waits for its
record's gate, so the order is the test's: the first in line of each key share
one ``Executor.prepare``, a second trigger of a key waits for the first to end,
and offsets are committed once every execution ended.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import anyio
import pytest
from aiokafka import TopicPartition  # type: ignore[import-untyped]

from leaseworker import JobContext, PodConfig, ReportJob, Trigger
from leaseworker._execution import Executor, Prepared
from leaseworker._kafka import KafkaTriggerSource
from leaseworker._worker import TriggerWay
from leaseworker.testing import MemoryLeases

from ..fake_kafka import FakeConsumer
from ..worker_util import Progress

pytestmark = pytest.mark.fake

TP = TopicPartition("t", 0)


class KeyedGates(ReportJob):
    """Offsets 0 and 1 are job key ``a``, 2 is ``b``; each run waits for its offset's gate."""

    topic = "t"
    lease_duration = 3.0

    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []
        self._gates: dict[int, anyio.Event] = {}
        self._changed = anyio.Event()

    def job_key(self, trigger: Trigger) -> str:
        """Return ``a`` for the first two offsets, ``b`` after."""
        return "a" if trigger.offset < 2 else "b"

    def gate(self, offset: int) -> anyio.Event:
        """Return the gate of the record at ``offset``."""
        return self._gates.setdefault(offset, anyio.Event())

    async def until(self, check: Callable[[], bool]) -> None:
        """Return once ``check()`` holds, re-checked whenever a run starts or ends."""
        with anyio.fail_after(5):
            while not check():
                await self._changed.wait()

    async def run(self, ctx: JobContext) -> object:
        """Log the start, wait for the gate, log the end."""
        offset = ctx.trigger.offset
        self._note("start", offset)
        await self.gate(offset).wait()
        self._note("end", offset)
        return None

    def _note(self, what: str, offset: int) -> None:
        self.log.append((what, offset))
        changed, self._changed = self._changed, anyio.Event()
        changed.set()


async def test_a_polls_triggers_run_one_per_key_in_arrival_order_and_prepare_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """a@0, a@1, b@2 in one poll: a@0 and b@2 prepared together and run; a@1 after a@0."""
    job = KeyedGates()
    executor = Executor(job, MemoryLeases(), pod="p")
    prepared: list[tuple[list[int], list[int]]] = []  # offsets prepared, offsets ended by then
    prepare = executor.prepare

    def counted(items: Sequence[tuple[Trigger, str]]) -> list[Prepared]:
        ended = [offset for what, offset in job.log if what == "end"]
        prepared.append(([trigger.offset for trigger, _ in items], ended))
        return prepare(items)

    monkeypatch.setattr(executor, "prepare", counted)
    consumer, progress = FakeConsumer(), Progress()
    source = KafkaTriggerSource(
        PodConfig(concurrency=4),
        topic="t",
        resolve_key=job.job_key,
        consumer_factory=consumer.factory,
        hooks=[progress],
    )
    consumer.add(TP, 3)
    async with anyio.create_task_group() as tg:
        await tg.start(TriggerWay(source, executor).run)
        await consumer.assign({TP})
        await job.until(lambda: len(job.log) == 2)
        assert sorted(job.log) == [("start", 0), ("start", 2)]  # a@1 waits behind a@0
        assert source.stats.in_flight == 3
        job.gate(0).set()
        await job.until(lambda: ("start", 1) in job.log)
        assert job.log[2:] == [("end", 0), ("start", 1)]
        job.gate(1).set()
        job.gate(2).set()
        await progress.until(lambda: source.stats.finished == 3, timeout=5)
        source.stop()
    # The first in line together; a@1 alone once a@0 ended, not at once against a@0's
    # lease (busy); an empty poll prepares nothing.
    assert [(offsets, ended) for offsets, ended in prepared if offsets] == [
        ([0, 2], []),
        ([1], [0]),
    ]
    assert consumer.commits[-1] == {TP: 3}
