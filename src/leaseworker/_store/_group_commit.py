"""Group commit: calls waiting for a database connection share its next trip.

N concurrent completions cost one transaction, one fsync and one thread hop
(SQLite) or one round trip (PostgreSQL) instead of N of each. No background
task: the first waiting caller leads the next batch for everyone queued
before it. See docs/design.md#group-commit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, final

import anyio

_T = TypeVar("_T")


@dataclass(eq=False, slots=True)
class Call(Generic[_T]):
    """One store call waiting for, or answered by, a batch.

    ``op`` is what the batch runner needs to run the call (SQLite: a function
    of the connection; PostgreSQL: the call's arguments). It runs in the
    batch's transaction when ``writes`` is true (its ``outcome`` only counts
    once that transaction commits), on its own otherwise. ``deadline``
    (``time.monotonic()``) is when the caller stops waiting: a batch that
    starts later answers the call with an error without running it.
    """

    op: Any
    writes: bool
    deadline: float
    outcome: _T | None = field(default=None, init=False)
    error: BaseException | None = field(default=None, init=False)
    taken: bool = field(default=False, init=False)
    done: bool = field(default=False, init=False)
    # Its caller sleeps on it: a bare future, lighter than an event (one per call and wait).
    wake: asyncio.Future[None] | None = field(default=None, init=False)

    def wake_up(self) -> None:
        """Wake the call's caller if it sleeps (a cancelled sleep has ended already)."""
        wake = self.wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    def succeed(self, outcome: _T) -> None:
        """Answer the call with ``outcome``."""
        self.outcome, self.done = outcome, True

    def fail(self, error: BaseException) -> None:
        """Answer the call with ``error`` (raised to the caller)."""
        self.error, self.done = error, True

    def answer(self) -> _T:
        """Return the outcome or raise the error of an answered call."""
        if self.error is not None:
            raise self.error
        return self.outcome  # type: ignore[return-value]  # None when _T allows it


RunBatch = Callable[[list[Call[object]]], Awaitable[None]]
"""Run one batch and answer each of its calls (``succeed`` or ``fail``)."""


@final
class Batcher:
    """Queue calls for a database and run them in batches; see the module docstring.

    ``run_batch`` is awaited with every batch, shielded from cancellation (the
    calls' deadlines bound it): it may hop to a worker thread (SQLite) or make
    a round trip (PostgreSQL). Up to ``max_in_flight`` batches run at once
    (one per connection); calls that arrive meanwhile queue for the next.
    ``inline`` (a private in-memory database) runs each call at once as a
    batch of its own: nothing to wait for, so nothing to share.
    """

    def __init__(
        self,
        run_batch: RunBatch,
        *,
        max_batch: int = 64,
        inline: bool = False,
        max_in_flight: int = 1,
    ) -> None:
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._inline = inline
        self._max_in_flight = max_in_flight
        self._queue: list[Call[object]] = []
        self._running = 0  # batches using a connection now (close counts as all of them)
        self._idle: anyio.Event | None = None  # close() waits on it for running to reach 0

    @property
    def idle(self) -> bool:
        """Whether no batch runs and none waits: a call made now could run at once."""
        return not self._running and not self._queue

    async def submit(self, call: Call[_T]) -> _T:
        """Queue ``call`` and return its outcome once a batch has answered it."""
        if self._inline:
            await anyio.lowlevel.checkpoint_if_cancelled()
            await self._run_answered([call])  # type: ignore[list-item]
            return call.answer()
        self._queue.append(call)  # type: ignore[arg-type]
        try:
            await self._until_answered(call)
        except anyio.get_cancelled_exc_class():
            if not call.taken:
                self._queue.remove(call)  # type: ignore[arg-type]
                self._hand_over()  # it may have been woken to lead the next batch
                raise
            with anyio.CancelScope(shield=True):  # the database may have acted on it already
                await self._until_answered(call)
            raise
        return call.answer()

    async def close(self, closer: Callable[[], Awaitable[object]]) -> None:
        """Await ``closer`` once no batch is running, and before any next one."""
        async with self.exclusive():
            await closer()

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Hold the database alone: once no batch runs, and until the block ends none starts.

        For ``close`` and for a job's transaction on the one SQLite connection;
        calls queued meanwhile run in the next batch.
        """
        while self._running:
            if self._idle is None:
                self._idle = anyio.Event()
            await self._idle.wait()
        self._running = self._max_in_flight
        try:
            yield
        finally:
            self._running = 0
            self._hand_over()

    async def _until_answered(self, call: Call[_T]) -> None:
        """Lead a batch when one may start, else sleep until woken (answered, or to lead).

        Each caller sleeps on its own event: a batch's end wakes its callers
        and the oldest queued one, not every waiting task.
        """
        while not call.done:
            if not call.taken and self._running < self._max_in_flight:
                await self._lead()
            else:
                call.wake = asyncio.get_running_loop().create_future()
                await call.wake

    async def _lead(self) -> None:
        """Run the next batch (the oldest queued calls)."""
        self._running += 1
        # One pass of the event loop first: calls that tasks ready to run make now
        # join this batch (measured: a quarter fewer batches per trigger in a pod).
        await anyio.lowlevel.cancel_shielded_checkpoint()
        batch = self._queue[: self._max_batch]
        del self._queue[: self._max_batch]
        for call in batch:
            call.taken = True
        self._hand_over()  # another batch may start too (max_in_flight)
        try:
            # Shielded: the connection must not be reused while the database may
            # still act on the batch. The calls' deadlines bound it.
            with anyio.CancelScope(shield=True):
                await self._run_answered(batch)
        finally:
            unanswered = [call for call in batch if not call.done]  # cancelled before it ran
            for call in unanswered:
                call.taken = False
            self._queue[:0] = unanswered
            self._running -= 1
            for call in batch:
                if call.done:
                    call.wake_up()
            self._hand_over()

    async def _run_answered(self, batch: list[Call[object]]) -> None:
        """Run ``batch``; a failure of ``run_batch`` itself answers every call it left."""
        try:
            await self._run_batch(batch)
        except BaseException as exc:  # delivered to each caller instead (shielded: no cancel)
            for call in batch:
                if not call.done:
                    call.fail(exc)

    def _hand_over(self) -> None:
        """Wake the oldest queued caller if a batch may start, and ``close`` once idle."""
        if self._running < self._max_in_flight and self._queue:
            self._queue[0].wake_up()
        if self._running == 0 and self._idle is not None:
            self._idle.set()
            self._idle = None
