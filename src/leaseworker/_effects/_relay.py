"""The outbox relay: committed messages to Kafka, each job key's in commit order.

Every pod runs one. A round claims a batch of unsent rows for ``hold``
seconds (a key's rows only with its earlier ones: see
``EffectStore.claim_outbox``), sends each job key's rows one after the other,
the next only once the broker acknowledged the previous (keys in parallel),
and marks sent only what was acknowledged. A failed send stops its key's
chain for this round; the rest of the claim is sent again later (at least
once: receivers drop duplicates). A relay that dies leaves its claims to
expire, and another takes them over. See docs/effects.md#what-is-at-least-once-the-relay.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Protocol, final

import anyio

from .._backoff import Backoff
from .._errors import StoreUnavailable
from .._retry import Retries
from .._store._effects import EffectStore, OutboxRow

logger = logging.getLogger("leaseworker.relay")

RELAY_RETRY = Backoff(initial=0.2, cap=5.0)
"""Rounds after a failed send or an unavailable store (the broker or the store is down)."""


class Sender(Protocol):
    """Send one outbox row and return its (partition, offset) once the broker acknowledged it."""

    async def send(self, row: OutboxRow) -> tuple[int, int]:
        """Send ``row``; raise if the broker did not acknowledge it (it may still have it)."""
        ...


@final
class Relay:
    """One pod's relay; ``await relay.run(stop)`` until ``stop`` is set (see the module docstring).

    ``name`` identifies its claims (the pod name); ``batch`` rows per round;
    ``hold`` seconds a claim lasts before another relay may take it over
    (longer than a round's sends); after a round that found nothing to send
    it waits ``idle`` seconds, doubling up to ``idle_max`` while nothing comes.
    """

    def __init__(
        self,
        store: EffectStore,
        sender: Sender,
        *,
        name: str,
        batch: int = 100,
        hold: float = 30.0,
        idle: float = 0.05,
        idle_max: float = 1.0,
        retry: Backoff = RELAY_RETRY,
    ) -> None:
        self._store = store
        self._sender = sender
        self.name = name
        self._batch = batch
        self._hold = hold
        self._idle = idle
        self._idle_max = idle_max
        self._retry = retry
        self.sent = 0  # messages acknowledged and marked sent by this relay

    async def run(self, stop: anyio.Event) -> None:
        """Relay rounds until ``stop`` is set; the round in progress finishes first."""
        retries = Retries(self._retry)
        idle = self._idle
        while not stop.is_set():
            try:
                claimed, failed = await self.relay_once()
            except StoreUnavailable as exc:
                logger.warning("outbox relay: %s", exc, extra={"event": "relay_store_unavailable"})
                claimed, failed = 0, 1
            except Exception:  # a bug must not stop the pod: logged, retried with backoff
                logger.exception("outbox relay: round failed", extra={"event": "relay_failed"})
                claimed, failed = 0, 1
            if failed:
                await retries.wait(lambda delay, attempt: None)
                continue
            retries.reset()
            if claimed:
                idle = self._idle
                continue
            with anyio.move_on_after(idle):
                await stop.wait()
            idle = min(idle * 2, self._idle_max)

    async def relay_once(self) -> tuple[int, int]:
        """Claim one batch, send it, mark what was acknowledged; return (claimed, failed).

        Cancelled (the pod stops at once), it releases the rows it has not
        sent so another relay takes them without waiting for ``hold``.
        """
        rows = await self._store.claim_outbox(self.name, limit=self._batch, hold=self._hold)
        if not rows:
            return 0, 0
        acked: list[int] = []
        failures: list[BaseException] = []
        try:
            async with anyio.create_task_group() as tg:
                for chain in _chains(rows):
                    tg.start_soon(self._send_chain, chain, acked, failures)
        finally:
            with anyio.CancelScope(shield=True):
                await self._settle(rows, acked)
        return len(rows), len(failures)

    async def _send_chain(
        self, chain: Sequence[OutboxRow], acked: list[int], failures: list[BaseException]
    ) -> None:
        """Send one job key's rows in order, each after the previous was acknowledged."""
        for row in chain:
            try:
                await self._sender.send(row)
            except Exception as exc:  # the broker is down or refused: the rest waits
                failures.append(exc)
                logger.warning(
                    "outbox relay: sending %s to %s failed (%s); retried",
                    row.effect_id,
                    row.message.topic,
                    type(exc).__name__,
                    extra={"event": "relay_send_failed", "jobId": row.job_key},
                )
                return
            acked.append(row.id)

    async def _settle(self, rows: Sequence[OutboxRow], acked: list[int]) -> None:
        """Mark the acknowledged rows sent; release the others (best effort: claims expire)."""
        if acked:
            self.sent += await self._store.mark_sent(self.name, acked)
        done = set(acked)
        unsent = [row.id for row in rows if row.id not in done]
        if unsent:
            with contextlib.suppress(StoreUnavailable):  # else the claims expire after ``hold``
                await self._store.release_outbox(self.name, unsent)


def _chains(rows: Sequence[OutboxRow]) -> list[list[OutboxRow]]:
    """Group ``rows`` (id order) by job key, keeping each key's order."""
    chains: dict[str, list[OutboxRow]] = {}
    for row in rows:
        chains.setdefault(row.job_key, []).append(row)
    return list(chains.values())
