"""The outbox bell: this process's relay wakes when a transaction of this process commits messages.

The executor rings it after a job's transaction committed outbox rows; the
relay of the same store waits on it between rounds instead of sleeping out
its poll interval, so a message leaves within a round trip or two of its
commit. Rows committed by other processes are still found by polling (and
a dead pod's claims by their expiry). Every store that keeps an outbox has
one, ``store.outbox_bell`` (see ``EffectStore``), shared by its views.
"""

from __future__ import annotations

from typing import final

import anyio


@final
class OutboxBell:
    """Counts rings; :meth:`wait` returns at the first ring after the count it was given."""

    def __init__(self) -> None:
        self.rings = 0
        self._waiting: anyio.Event | None = None

    def ring(self) -> None:
        """Wake every waiter (a commit added rows, or the relay is told to stop)."""
        self.rings += 1
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            waiting.set()

    async def wait(self, seen: int, within: float) -> None:
        """Wait up to ``within`` seconds for a ring after ``seen`` (at once if one came)."""
        if self.rings != seen:
            return
        if self._waiting is None:
            self._waiting = anyio.Event()
        waiting = self._waiting
        with anyio.move_on_after(within):
            await waiting.wait()
