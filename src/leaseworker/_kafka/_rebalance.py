"""Rebalances: what happens to this pod's partitions when the group moves them.

aiokafka awaits :class:`Rebalance`'s callbacks inside the group protocol. A
revoke gives the partitions' executions ``revoke_timeout`` to finish, cancels
the rest (their leases released), commits the completed prefix and only then
gives the partitions up; an assignment starts tracking the new partitions and
re-applies the pauses, which aiokafka forgets on every assignment.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, final

import anyio
from aiokafka.abc import ConsumerRebalanceListener  # type: ignore[import-untyped]

from ._commits import Commits
from ._log_names import logger, names
from ._settings import SourceSettings
from ._state import Partition, SourceState, release_grace


@final
class Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """The consumer's rebalance listener: revoke and assign the partitions of ``state``.

    ``apply_pauses`` pauses or resumes every assigned partition as the source
    wants it now (full or stopping: paused).
    """

    def __init__(
        self,
        state: SourceState,
        settings: SourceSettings,
        commits: Commits,
        *,
        apply_pauses: Callable[[], None],
    ) -> None:
        self._state = state
        self._stats = state.stats
        self._settings = settings
        self._commits = commits
        self._apply_pauses = apply_pauses

    async def on_partitions_revoked(self, revoked: Iterable[Any]) -> None:
        """Finish or stop the revoked partitions' executions, then commit them.

        Runs inside aiokafka's rebalance (its heartbeat keeps going); the group
        waits for it up to ``config.rebalance_timeout``, which is sized to the
        bounds used here.
        """
        began = anyio.current_time()
        if self._stats.membership in ("assigned", "idle"):
            self._stats.membership = "rebalancing"
            self._state.event("revoking")
        parts = [self._state.partitions[tp] for tp in revoked if tp in self._state.partitions]
        if not parts:
            return  # aiokafka calls this with nothing before the first join
        cancelled = await self._stop_executions(parts)
        await self._commits.last(parts)
        for part in parts:
            part.gone = True
            if self._state.partitions.get(part.tp) is part:
                del self._state.partitions[part.tp]
        self._stats.revocations += 1
        self._stats.cancelled_on_revoke += cancelled
        logger.info(
            "partitions revoked: %s; %d execution(s) cancelled after %.1fs, took %.0f ms",
            names(part.tp for part in parts),
            cancelled,
            self._settings.revoke_timeout,
            (anyio.current_time() - began) * 1000,
            extra={"event": "revoked", "pod": self._settings.pod},
        )
        for part in parts:
            self._state.event("revoked", topic=part.tp.topic, partition=part.tp.partition)

    async def _stop_executions(self, parts: list[Partition]) -> int:
        """Let ``parts``' executions finish within ``revoke_timeout``; cancel the rest.

        Returns how many were cancelled; they get the release grace to end.
        """
        for part in parts:
            part.revoking = True

        def idle() -> bool:
            return not any(part.tasks for part in parts)

        with anyio.move_on_after(self._settings.revoke_timeout):
            await self._state.wait(idle)
        cancelled = sum(part.cancel() for part in parts)
        with anyio.move_on_after(release_grace(self._settings)):
            await self._state.wait(idle)
        return cancelled

    async def on_partitions_assigned(self, assigned: Iterable[Any]) -> None:
        """Start tracking newly assigned partitions and re-apply pauses."""
        tps = set(assigned)
        for tp in tps:
            if tp not in self._state.partitions:
                self._state.partitions[tp] = Partition(tp)
        self._stats.assignments += 1
        self._stats.assigned_partitions = len(tps)
        if not self._state.stopping:
            self._stats.membership = "assigned" if tps else "idle"
        self._apply_pauses()
        logger.info(
            "partitions assigned: %s",
            names(self._state.partitions),
            extra={"event": "assigned", "pod": self._settings.pod},
        )
        self._state.event("assigned", partitions=tuple(tps))
