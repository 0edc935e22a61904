"""Offset commits: the completed prefix of each partition, one commit at a time.

A committer task beside the poll loop commits whatever moved; a partition
given up (rebalance, shutdown) gets a last commit, retried within
``commit_timeout``. A commit the group rejects after a rebalance means the
partition belongs to another member now: recorded, logged, never a crash.
Each commit first awaits the store's barrier (``store.durable()``, when it
has one): what the offsets cover must be on disk before Kafka forgets it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, final

import anyio
from aiokafka.errors import (  # type: ignore[import-untyped]
    CommitFailedError,
    IllegalStateError,
    KafkaError,
)

from .._errors import StoreUnavailable
from .._store import Barrier
from ._log_names import describe, logger, names
from ._settings import SourceSettings
from ._state import Partition, SourceState

SendCommit = Callable[[dict[Any, int]], Awaitable[None]]
"""Commit ``{topic-partition: next offset}`` to Kafka (the consumer's ``commit``)."""


@final
class Commits:
    """Commit the partitions of ``state`` through ``send``, as their prefixes complete.

    ``barrier``, awaited before each send, makes lasting whatever the
    executions of the offsets being committed wrote or read (the store's
    ``durable``); it raises :class:`StoreUnavailable` when it cannot, and the
    commit is then tried again like one Kafka failed.
    """

    def __init__(
        self,
        state: SourceState,
        settings: SourceSettings,
        send: SendCommit,
        barrier: Barrier | None = None,
    ) -> None:
        self._state = state
        self._stats = state.stats
        self._settings = settings
        self._send = send
        self._barrier = barrier
        self._lock = anyio.Lock()

    async def run(self) -> None:
        """Commit completed prefixes as they move, beside the poll loop (until cancelled).

        One commit is in flight at a time; whatever completes meanwhile goes
        into the next one, so commits batch themselves under load and the poll
        loop never waits for a commit round trip. A failed commit is retried
        after ``poll_timeout``.
        """
        while True:
            await self._state.wait(self._committable)
            if not await self.commit(self._active()):
                await anyio.sleep(self._settings.poll_timeout)

    def _active(self) -> list[Partition]:
        return [p for p in self._state.partitions.values() if not p.revoking]

    def _committable(self) -> bool:
        if self._stats.commit_checked != self._stats.finished:
            self._stats.commit_checked = self._stats.finished
            self._state.event("commit_checked")  # "the committer caught up" may hold now
        return any(not p.gone and p.tracker.committable() for p in self._active())

    async def last(self, parts: list[Partition]) -> None:
        """Commit ``parts`` before they are given up (rebalance, shutdown), retrying.

        There is no later commit for them, so a failure is tried again (a
        coordinator moving, a broker restarting) until ``commit_timeout`` is
        spent in all, the same bound as a single try: what is not committed
        then is delivered again (and answered ``duplicate`` with a store).
        """
        deadline = anyio.current_time() + self._settings.commit_timeout
        while not await self.commit(parts, within=deadline - anyio.current_time()):
            left = deadline - anyio.current_time()
            if left <= 0:
                return
            await anyio.sleep(min(self._settings.poll_timeout, left))

    async def commit(self, parts: Iterable[Partition], *, within: float | None = None) -> bool:
        """Commit each partition's contiguous completed prefix, if it moved.

        Return ``False`` when Kafka failed the commit (it is retried later).
        ``within``: seconds the try may take (default ``commit_timeout``).
        """
        parts = list(parts)
        if not any(not p.gone and p.tracker.committable() for p in parts):
            return True
        # The wait for a commit already in flight counts too: the revoke step's
        # bound (``rebalance_timeout``) has room for one commit_timeout.
        limit = self._settings.commit_timeout if within is None else within
        deadline = anyio.current_time() + limit
        with anyio.move_on_after(limit) as waiting:
            await self._lock.acquire()
        if waiting.cancelled_caught:
            return False  # another commit held the lock all along; this one is tried again
        try:
            # What is committable now: the commit waited for may have taken some of it.
            ready = {
                p.tp: (p, pos) for p in parts if not p.gone and (pos := p.tracker.committable())
            }
            if not ready:
                return True
            offsets = {tp: pos for tp, (_, pos) in ready.items()}
            began = anyio.current_time()
            try:
                with anyio.fail_after(deadline - began):
                    if self._barrier is not None:  # after ``ready``: it covers those offsets' ends
                        await self._barrier()
                    await self._send(offsets)
            except (CommitFailedError, IllegalStateError) as exc:
                self._rejected(ready.values(), offsets, began, exc)
                return True
            except (KafkaError, TimeoutError, StoreUnavailable) as exc:
                self._failed(offsets, began, exc)
                return False
        finally:
            self._lock.release()
        for part, pos in ready.values():
            part.tracker.committed(pos)
        self._stats.commits += 1
        self._state.event("committed", offsets=offsets, began=began)
        logger.debug(
            "committed %s", names(offsets), extra={"event": "committed", "pod": self._settings.pod}
        )
        return True

    def _rejected(
        self,
        ready: Iterable[tuple[Partition, int]],
        offsets: dict[Any, int],
        began: float,
        exc: BaseException,
    ) -> None:
        """Record a commit the group refused: the partitions belong to another member now."""
        self._stats.ownership_losses += 1
        self._state.event("committed", offsets=offsets, began=began, error=exc, rejected=True)
        for part, _ in ready:
            part.gone = True
        logger.warning(
            "commit rejected after a rebalance (%s): partitions %s now belong to "
            "another member, which re-reads them from the last committed offset",
            type(exc).__name__,
            names(offsets),
            exc_info=False,
            extra={"event": "ownership_lost", "pod": self._settings.pod},
        )

    def _failed(self, offsets: dict[Any, int], began: float, exc: BaseException) -> None:
        """Kafka failed the commit (a coordinator moving, a timeout): it is tried again."""
        self._stats.commit_errors += 1
        self._state.event("committed", offsets=offsets, began=began, error=exc)
        logger.warning(
            "commit failed (%s); will retry",
            describe(exc),
            extra={"event": "commit_failed", "pod": self._settings.pod},
        )
