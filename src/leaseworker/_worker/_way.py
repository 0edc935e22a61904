"""The trigger's way: a Kafka record from the source's poll to its offset's commit.

One record, top to bottom (:class:`TriggerWay`):

1. **poll**: the source hands out as many records as the pod has free
   slots (it pauses its partitions while full and fetches the rest again);
2. **decode**: each becomes a trigger and its job key (``job.job_key``),
   or a malformed record;
3. **line up**: one execution of a job key at a time in this pod, in
   arrival order; the triggers first in line for their keys share the
   poll's one store lookup (``Executor.prepare``);
4. **run**, each record in its own task, which a revoke or the shutdown
   deadline cancels: a malformed record is dead-lettered; a trigger runs
   ``Executor.run`` under its key's lock until a terminal outcome, and is
   dead-lettered when that outcome asks for it (failed, timed out, lost
   repeatedly);
5. **commit**: a terminal record's offset is done; the source's committer
   commits each partition's done prefix, after the store's barrier.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, final

import anyio

from .._errors import MalformedTrigger
from .._execution import Ending, Prepared, Trigger
from .._kafka import KafkaTriggerSource, Partition, Taken


class Executions(Protocol):
    """What runs the way's triggers: the pod's :class:`~leaseworker._execution.Executor`."""

    def prepare(self, items: Sequence[tuple[Trigger, str]]) -> list[Prepared]:
        """Look the triggers first in line up together (one store call)."""
        ...

    async def run(self, trigger: Trigger, job_key: str, prepared: Prepared | None = None) -> Ending:
        """Run one trigger's executions until one reaches an end."""
        ...


@final
class TriggerWay:
    """Run the records ``source`` polls as executions of ``executor``, until it is stopped."""

    def __init__(self, source: KafkaTriggerSource, executor: Executions) -> None:
        self._source = source
        self._executor = executor
        self._keys: dict[str, tuple[anyio.Lock, int]] = {}  # the lock and users of a job key

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Poll (1) and dispatch each poll until the source is stopped and drained.

        ``task_status.started()`` once Kafka is connected, or when stopped
        before it ever was. The source's committer (5) runs meanwhile.
        """
        async with self._source.joined(task_status) as polls:
            async for taken in polls:
                self._dispatch(taken)

    def _dispatch(self, taken: Taken) -> None:
        """Decode a poll's records (2), line their triggers up (3), start each in its task (4)."""
        decoded = [(part, record, *self._source.decode(record)) for part, record in taken]
        valid = [(found, key) for _, _, found, key in decoded if isinstance(found, Trigger)]
        lined_up = iter(self._line_up(valid))
        for part, record, found, job_key in decoded:
            prepared = next(lined_up) if isinstance(found, Trigger) else None
            self._source.start(part, record, self._process, part, record, found, job_key, prepared)

    def _line_up(self, items: Sequence[tuple[Trigger, str]]) -> list[Prepared | None]:
        """Line a poll's triggers up on their job keys; prepare the first in line together.

        One execution of a job key at a time in this pod, in arrival order; the
        lock lives while the key has users. A trigger first in line for its key
        shares the poll's one store lookup: no execution of its key can run in
        this pod before its own. One behind another waits for the lock and looks
        up alone then (``None``), after the one before it may have completed the
        identity.
        """
        first: list[int] = []
        for i, (_, job_key) in enumerate(items):
            lock, users = self._keys.get(job_key) or (anyio.Lock(fast_acquire=True), 0)
            self._keys[job_key] = (lock, users + 1)
            if not users:
                first.append(i)
        shared = self._executor.prepare([items[i] for i in first])
        prepared: list[Prepared | None] = [None] * len(items)
        for i, one in zip(first, shared, strict=True):
            prepared[i] = one
        return prepared

    async def _process(
        self,
        part: Partition,
        record: Any,
        found: Trigger | MalformedTrigger,
        job_key: str,
        prepared: Prepared | None,
    ) -> None:
        """Run one record to its end (4); its offset is done (5) if that end is terminal."""
        done = False
        error: BaseException | None = None
        self._source.processing(record)
        try:
            done = await self._to_end(record, found, job_key, prepared)
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._source.processed(part, record, done=done, error=error)

    async def _to_end(
        self,
        record: Any,
        found: Trigger | MalformedTrigger,
        job_key: str,
        prepared: Prepared | None,
    ) -> bool:
        """Dead-letter a malformed record, or run the trigger; return whether it ended for good."""
        if isinstance(found, MalformedTrigger):
            await self._source.malformed(record, found)
            return True
        self._source.received(record, found, job_key)
        ending = await self._execute(found, job_key, prepared)
        if ending.dead_letter is not None:  # terminal, and dead-lettered naming why
            await self._source.dead_letter(record, job_key, ending)
            return True
        return ending.terminal

    async def _execute(self, trigger: Trigger, job_key: str, prepared: Prepared | None) -> Ending:
        """Run the trigger's executions once those lined up before it on its key ended."""
        # fast_acquire: an uncontended key does not yield to the loop (the executor's
        # first await does).
        lock, _ = self._keys[job_key]
        try:
            async with lock:
                return await self._executor.run(trigger, job_key, prepared)
        finally:
            lock, users = self._keys[job_key]
            if users == 1:
                del self._keys[job_key]
            else:
                self._keys[job_key] = (lock, users - 1)
