"""The outbox relay: committed messages to Kafka, each job key's in commit order.

Every pod runs one. A round claims a batch of unsent rows for ``hold``
seconds (a key's rows only with its earlier ones: see
``EffectStore.claim_outbox``), sends each job key's rows one after the other,
the next only once the broker acknowledged the previous (keys in parallel),
and marks sent only what was acknowledged. A failed send stops its key's
chain for this round; the rest of the claim is sent again later (at least
once: receivers drop duplicates). A relay that dies leaves its claims to
expire, and another takes them over. ``run`` keeps ``in_flight`` rounds
claiming or sending at once, and lets the next claim start while a round's
mark goes on (each round under a claim name of its own, so a round never
takes another's rows and a key's order holds across them; on PostgreSQL a
claim past the relay's share of the pool waits for a round's mark); it wakes at this
process's commits (the store's ``outbox_bell``) and, after a claim, prunes sent
rows older than ``retention`` beside the rounds. Its hooks get an
``EffectEvent`` per send (``sent``, ``send_failed``, in the relay's task,
after the broker's answer) and, every ``backlog_every`` seconds, the
store's ``backlog``.
See docs/effects.md#what-is-at-least-once-the-relay.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, Protocol, final

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._backoff import Backoff
from .._errors import StoreUnavailable
from .._events import EffectEvent, Hook, emit, hooks_for
from .._retry import Retries
from .._store import EffectStore, OutboxBell, OutboxRow

logger = logging.getLogger("leaseworker.relay")

RELAY_RETRY = Backoff(initial=0.2, cap=5.0)
"""Rounds after a failed send or an unavailable store (the broker or the store is down)."""

RETENTION = 86_400.0
"""Seconds a sent row is kept (for ``leaseworker inspect``) before the relay prunes it."""

CLAIM_HOLD = 30.0
"""Seconds a relay's claim lasts before another relay may take the rows over."""


class Sender(Protocol):
    """Send outbox rows at once and say, per row, where the broker acknowledged it or why not."""

    async def send_batch(self, rows: Sequence[OutboxRow]) -> list[tuple[int, int] | Exception]:
        """Send ``rows`` together; return each one's (partition, offset), or the failure.

        A failed row may still have reached the broker. The relay hands it
        rows of distinct job keys only, so their order does not matter.
        """
        ...


@final
class Relay:
    """One pod's relay; ``await relay.run(stop)`` until ``stop`` is set (see the module docstring).

    ``name`` identifies its claims (the pod name); ``batch`` rows per round;
    ``hold`` seconds a claim lasts before another relay may take it over
    (longer than a round's sends); after a round that found nothing to send
    it waits ``idle`` seconds, doubling up to ``idle_max`` while nothing comes,
    or until this process commits messages. ``in_flight`` rounds at most
    claim or send at once (a round's mark does not count: the next claim
    runs beside it); after a round of less than ``batch`` rows the next claim
    waits ``linger`` seconds, so that under load rounds are fuller; every
    ``prune_every`` seconds sent rows older than ``retention`` seconds are
    deleted (never an unsent one). ``hooks`` receive its
    :class:`~leaseworker.effects.EffectEvent` s; only with hooks does it ask
    the store for its backlog (every ``backlog_every`` seconds; ``None``: never).
    """

    def __init__(
        self,
        store: EffectStore,
        sender: Sender,
        *,
        name: str,
        batch: int = 1000,
        hold: float = CLAIM_HOLD,
        idle: float = 0.05,
        idle_max: float = 1.0,
        retry: Backoff = RELAY_RETRY,
        in_flight: int = 3,
        linger: float = 0.01,
        retention: float = RETENTION,
        prune_every: float = 60.0,
        hooks: Iterable[Hook] = (),
        backlog_every: float | None = 5.0,
    ) -> None:
        self._store = store
        self._sender = sender
        self.name = name
        self._batch = batch
        self._hold = hold
        self._idle = idle
        self._idle_max = idle_max
        self._retry = retry
        self._linger = linger
        self._retention = retention
        self._prune_every = prune_every
        self._pruned_at: float | None = None
        self._pruning = False  # a prune runs beside the rounds
        self._bell = store.outbox_bell
        self._in_flight = max(1, in_flight)
        # A round sends under a slot (``in_flight``) and settles under its claim name only:
        # the next claim starts while the last one's mark goes on.
        self._claimers = [f"{name}/{n}" for n in range(2 * self._in_flight)]
        self._failed = 0  # sends (and prunes) failed in ``run`` since it last looked
        self.sent = 0  # messages acknowledged and marked sent by this relay
        self.pruned = 0  # sent rows this relay deleted after ``retention``
        self._hooks = hooks_for(hooks, EffectEvent)
        self._backlog_every = backlog_every
        self._backlog_at: float | None = None  # anyio's clock: the first claim samples it

    async def run(self, stop: anyio.Event) -> None:
        """Relay rounds until ``stop`` is set; the rounds in progress finish first."""
        free_send, free = anyio.create_memory_object_stream[str](len(self._claimers))
        for claimer in self._claimers:
            free_send.send_nowait(claimer)
        with free_send, free:
            await self._rounds(stop, free_send, free, anyio.Semaphore(self._in_flight))

    async def _rounds(
        self,
        stop: anyio.Event,
        free_send: MemoryObjectSendStream[str],
        free: MemoryObjectReceiveStream[str],
        sending: anyio.Semaphore,
    ) -> None:
        """Claim into a free slot and start the round; back off after failures, wait when idle."""
        retries = Retries(self._retry)
        idle = self._idle
        async with anyio.create_task_group() as tg:
            tg.start_soon(_ring_when_set, stop, self._bell)
            while not stop.is_set():
                seen = self._bell.rings  # before any wait: a stop rung meanwhile is seen
                claimer = await _slot(sending, free)  # at most ``in_flight`` rounds claim or send
                rows, failed = await self._claim_logged(claimer)
                if rows:
                    tg.start_soon(self._round, claimer, rows, free_send, sending)
                else:
                    free_send.send_nowait(claimer)
                    sending.release()
                self._prune_soon(tg)  # beside the rounds: the next claim does not wait for it
                failed, self._failed = failed + self._failed, 0
                if failed:
                    for _ in self._claimers:  # the rounds in flight finish before the backoff
                        free_send.send_nowait(await free.receive())
                    await retries.wait(lambda delay, attempt: None)
                    continue
                retries.reset()
                if rows:
                    idle = self._idle
                    if len(rows) < self._batch:  # let commits gather: fewer, fuller rounds
                        await anyio.sleep(self._linger)
                    continue
                await self._bell.wait(seen, idle)  # a commit of this process rings it
                idle = min(idle * 2, self._idle_max)

    async def relay_once(self) -> tuple[int, int]:
        """Claim one batch, send it, mark what was acknowledged; return (claimed, failed).

        Cancelled (the pod stops at once), it releases the rows it has not
        sent so another relay takes them without waiting for ``hold``.
        """
        claimer = self._claimers[0]
        rows = await self._store.claim_outbox(claimer, limit=self._batch, hold=self._hold)
        if not rows:
            return 0, 0
        return len(rows), await self._deliver(claimer, rows)

    async def _claim_logged(self, claimer: str) -> tuple[list[OutboxRow], int]:
        """Claim a batch (the backlog reported first, if due); a failure is logged and counted."""
        try:
            await self._backlog()
            return await self._store.claim_outbox(claimer, limit=self._batch, hold=self._hold), 0
        except Exception as exc:  # a bug must not stop the pod: logged, retried with backoff
            return [], _logged(exc)

    def _prune_soon(self, tg: TaskGroup) -> None:
        """Start a prune in ``tg`` if one is due and none runs (after a claim: not before sends)."""
        now = anyio.current_time()
        due = self._pruned_at is None or now - self._pruned_at >= self._prune_every
        if due and not self._pruning:
            self._pruned_at, self._pruning = now, True
            tg.start_soon(self._prune)

    async def _round(
        self,
        claimer: str,
        rows: Sequence[OutboxRow],
        free: MemoryObjectSendStream[str],
        sending: anyio.Semaphore,
    ) -> None:
        """One round of ``run``: send (its slot then freed) and settle ``rows``; free its name."""
        released = False

        def sent() -> None:  # once: after the sends, or when the round ends otherwise
            nonlocal released
            if not released:
                released = True
                sending.release()

        try:
            failed = await self._deliver(claimer, rows, sent)  # awaited first: rounds overlap
            self._failed += failed
        except Exception:  # the settle's store call failed: the claims expire after ``hold``
            logger.exception("outbox relay: round failed", extra={"event": "relay_failed"})
            self._failed += 1
        finally:
            sent()
            free.send_nowait(claimer)

    async def _deliver(
        self, claimer: str, rows: Sequence[OutboxRow], sent: Callable[[], None] = lambda: None
    ) -> int:
        """Send the keys' chains in waves, mark or release; return failed sends.

        A wave sends the next row of every chain still going, together (one
        batch for the producer); a chain's next row waits for the next wave,
        so it leaves only once the broker acknowledged the previous one.
        """
        acked: list[int] = []
        failures = 0
        try:
            wave, later = _first_of_each_key(rows)
            while wave:
                going = []
                began = anyio.current_time()
                for row, outcome in zip(wave, await self._sender.send_batch(wave), strict=True):
                    if isinstance(outcome, Exception):  # the broker is down or refused it:
                        # this key's later rows wait for a later round
                        failures += 1
                        self._send_failed(row, outcome)
                        self._emit("send_failed", row, began, error=outcome)
                        continue
                    acked.append(row.id)
                    if self._hooks:
                        self._emit("sent", row, began, partition=outcome[0], offset=outcome[1])
                    rest = later.get(row.job_key)
                    if rest:
                        going.append(rest.pop())
                wave = going
            sent()
        finally:
            with anyio.CancelScope(shield=True):
                await self._settle(claimer, rows, acked)
        return failures

    async def _prune(self) -> None:
        """Delete sent rows older than ``retention``; a failure is logged, the rounds back off."""
        try:
            self.pruned += await self._store.prune_outbox(self._retention)
        except Exception as exc:
            self._failed += _logged(exc)
        finally:
            self._pruning = False

    async def _backlog(self) -> None:
        """Tell the hooks how many messages are unsent and how old the oldest is (at times)."""
        now = anyio.current_time()
        if (
            not self._hooks
            or self._backlog_every is None
            or (self._backlog_at is not None and now - self._backlog_at < self._backlog_every)
        ):
            return
        self._backlog_at = now
        depth, oldest_age = await self._store.outbox_backlog()
        event = EffectEvent(name="backlog", depth=depth, oldest_age=oldest_age, relay=self.name)
        emit(self._hooks, event)

    def _emit(
        self, name: Literal["sent", "send_failed"], row: OutboxRow, began: float, **fields: Any
    ) -> None:
        if self._hooks:
            event = EffectEvent(
                name=name,
                topic=row.message.topic,
                effect_id=row.effect_id,
                job_key=row.job_key,
                fence=row.fence,
                trace=row.message.trace,
                began=began,
                elapsed=anyio.current_time() - began,
                relay=self.name,
                **fields,
            )
            emit(self._hooks, event)

    def _send_failed(self, row: OutboxRow, exc: Exception) -> None:
        logger.warning(
            "outbox relay: sending %s to %s failed (%s); retried",
            row.effect_id,
            row.message.topic,
            type(exc).__name__,
            extra={"event": "relay_send_failed", "jobId": row.job_key},
        )

    async def _settle(self, claimer: str, rows: Sequence[OutboxRow], acked: list[int]) -> None:
        """Mark the acknowledged rows sent; release the others (best effort: claims expire)."""
        if acked:
            marked = await self._store.mark_sent(claimer, acked)  # awaited first: rounds overlap
            self.sent += marked
        done = set(acked)
        unsent = [row.id for row in rows if row.id not in done]
        if unsent:
            with contextlib.suppress(StoreUnavailable):  # else the claims expire after ``hold``
                await self._store.release_outbox(claimer, unsent)


def _logged(exc: Exception) -> int:
    """Log a failed store call of a round (in its ``except``: a bug with its traceback); 1."""
    if isinstance(exc, StoreUnavailable):
        logger.warning("outbox relay: %s", exc, extra={"event": "relay_store_unavailable"})
    else:
        logger.exception("outbox relay: round failed", extra={"event": "relay_failed"})
    return 1


def _first_of_each_key(
    rows: Sequence[OutboxRow],
) -> tuple[list[OutboxRow], dict[str, list[OutboxRow]]]:
    """Split ``rows`` (id order): each job key's first row, and each key's later ones, last first.

    The first wave sends the former; a key's next row is ``pop()`` ed once the
    previous one was acknowledged.
    """
    first: list[OutboxRow] = []
    later: dict[str, list[OutboxRow]] = {}
    seen: set[str] = set()
    for row in rows:
        if row.job_key in seen:
            later.setdefault(row.job_key, []).append(row)
        else:
            seen.add(row.job_key)
            first.append(row)
    for chain in later.values():
        chain.reverse()
    return first, later


async def _slot(sending: anyio.Semaphore, free: MemoryObjectReceiveStream[str]) -> str:
    """Take a sending slot and a claim name no round holds, without yielding while both are free.

    anyio's ``acquire`` and ``receive`` yield even then, and the round just
    started would build its wave (milliseconds of CPU) before the next claim
    reached the store: the store idled through every build, and claims and
    sends took turns instead of overlapping (bench/README.md, relay).
    """
    try:
        sending.acquire_nowait()
    except anyio.WouldBlock:
        await sending.acquire()
    try:
        return free.receive_nowait()
    except anyio.WouldBlock:
        return await free.receive()


async def _ring_when_set(stop: anyio.Event, bell: OutboxBell) -> None:
    """Ring ``bell`` once ``stop`` is set, so an idle relay stops at once."""
    await stop.wait()
    bell.ring()
