"""What the source's parts share: its partitions, its counters, its stop flag.

The poll loop, the committer and the rebalance listener run as separate tasks
over one :class:`SourceState`; whoever changes something another may wait
for calls :meth:`SourceState.notify`, and every waiter re-checks its
condition then (:meth:`SourceState.wait`), so nobody polls a counter. Each
step is also told to the source's hooks (:meth:`SourceState.event`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, final

import anyio

from .._events import Hook, SourceEvent, SourceEventName, emit, hooks_for
from ._offsets import OffsetTracker
from ._settings import SourceSettings


@dataclass(slots=True)
class SourceStats:
    """Counters of one source, for tests and operators (read-only outside the source).

    ``membership`` is the consumer's place in its group, for readiness:
    ``starting``, ``joining`` (client started, no assignment yet),
    ``assigned`` or ``idle`` (joined, with or without partitions),
    ``rebalancing`` (partitions revoked, waiting for the next assignment) or
    ``stopping``. ``last_poll_at`` is the monotonic time of the last successful
    poll. ``waiting_for`` says what start-up is waiting for now (``Kafka at
    host:port unreachable (...); retrying in 2.0s``), ``None`` once nothing.
    The three are replaced by single assignments, so another thread (the
    health server) may read them. ``finished`` counts records whose processing
    ended (terminal or not); ``commit_checked`` is what ``finished`` was when the
    committer last looked for something to commit: once it has caught up, a
    commit that should not happen would have happened.
    """

    polls: int = 0
    assignments: int = 0
    revocations: int = 0
    commits: int = 0
    commit_errors: int = 0
    ownership_losses: int = 0
    dead_letters: int = 0
    job_failures: int = 0
    malformed: int = 0
    pauses: int = 0
    paused: bool = False
    in_flight: int = 0
    finished: int = 0
    commit_checked: int = 0
    cancelled_on_revoke: int = 0
    cancelled_on_shutdown: int = 0
    membership: str = "starting"
    assigned_partitions: int = 0
    last_poll_at: float | None = None
    waiting_for: str | None = None


@dataclass(eq=False)
class Partition:
    """What this pod knows about one assigned partition, for one assignment."""

    tp: Any  # aiokafka TopicPartition
    tracker: OffsetTracker = field(default_factory=OffsetTracker)
    tasks: dict[int, anyio.TaskHandle[None]] = field(default_factory=dict)  # in flight, by offset
    revoking: bool = False
    gone: bool = False  # revoked or its commit was rejected: results no longer count here

    def cancel(self) -> int:
        """Cancel the partition's executions in flight; return how many there were."""
        for task in self.tasks.values():
            task.cancel()
        return len(self.tasks)


@final
class SourceState:
    """The partitions assigned now (by topic-partition), the counters, and progress."""

    def __init__(self, hooks: Iterable[Hook] = ()) -> None:
        self.hooks = hooks_for(hooks, SourceEvent)
        self.partitions: dict[Any, Partition] = {}
        self.stats = SourceStats()
        self.stopping = False
        # Made when someone waits, dropped when set: a notify with no waiter costs
        # nothing (an anyio.Event is not free to make), as on the hot path of
        # a pod that no test watches.
        self._work: anyio.Event | None = None

    def notify(self) -> None:
        """Wake every waiter: an execution ended or the source is stopping.

        The source's own waits (the committer, the poll loop's free slot, a
        revoke's drain) depend only on those; one wake-up per finished record.
        """
        work, self._work = self._work, None
        if work is not None:
            work.set()

    def event(self, name: SourceEventName, **fields: Any) -> None:
        """Tell the hooks of a step: after each change of the partitions or of a counter.

        With no hooks this costs one test: no event is made.
        """
        if self.hooks:
            emit(self.hooks, SourceEvent(name=name, **fields))

    async def wait(self, done: Callable[[], bool]) -> None:
        """Return once ``done()`` is true, re-checking it after each :meth:`notify`."""
        while not done():
            if self._work is None:
                self._work = anyio.Event()
            await self._work.wait()


def release_grace(settings: SourceSettings) -> float:
    """How long cancelled executions may take to release their leases."""
    return 2 * settings.redis_timeout + 0.5
