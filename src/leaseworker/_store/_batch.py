"""Group commit: calls waiting for one database connection share its next trip.

N concurrent completions cost one transaction, one fsync and one thread hop
instead of N of each. No background task: the first waiting caller leads the
next batch for everyone queued before it.
See docs/design.md#group-commit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar, final

import anyio

_T = TypeVar("_T")


@dataclass(eq=False, slots=True)
class Call(Generic[_T]):
    """One store call waiting for, or answered by, a batch.

    ``op`` runs in the batch's transaction when ``writes`` is true (its
    ``outcome`` only counts once that transaction commits), on its own
    otherwise. ``deadline`` (``time.monotonic()``) is when the caller stops
    waiting: a batch that starts later answers the call with an error
    without running it.
    """

    op: Callable[..., _T]
    writes: bool
    deadline: float
    outcome: _T | None = field(default=None, init=False)
    error: BaseException | None = field(default=None, init=False)
    taken: bool = field(default=False, init=False)
    done: bool = field(default=False, init=False)

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


@final
class Batcher:
    """Queue calls for one connection and run them in batches; see the module docstring.

    ``run_batch`` is called with every batch, in a worker thread, or on the
    event loop when ``inline`` (a private in-memory database: nothing to wait
    for, and a thread hop would cost more than the query). It must answer
    every call it is given (``succeed`` or ``fail``).
    """

    def __init__(
        self,
        run_batch: Callable[[list[Call[object]]], None],
        *,
        max_batch: int = 64,
        inline: bool = False,
    ) -> None:
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._inline = inline
        self._queue: list[Call[object]] = []
        self._leading = False  # a batch (or close) is using the connection
        self._turn = anyio.Event()  # set, and replaced, whenever a batch ends

    async def submit(self, call: Call[_T]) -> _T:
        """Queue ``call`` and return its outcome once a batch has answered it."""
        if self._inline:
            await anyio.lowlevel.checkpoint_if_cancelled()
            self._run_answered([call])  # type: ignore[list-item]
            return call.answer()
        self._queue.append(call)  # type: ignore[arg-type]
        try:
            await self._until_answered(call)
        except anyio.get_cancelled_exc_class():
            if not call.taken:
                self._queue.remove(call)  # type: ignore[arg-type]
                raise
            with anyio.CancelScope(shield=True):  # the database may have acted on it already
                await self._until_answered(call)
            raise
        return call.answer()

    async def close(self, closer: Callable[[], None]) -> None:
        """Run ``closer`` in a worker thread once no batch is running, and before any next."""
        while self._leading:
            await self._turn.wait()
        self._leading = True
        try:
            await anyio.to_thread.run_sync(closer)
        finally:
            self._hand_over()

    async def _until_answered(self, call: Call[_T]) -> None:
        while not call.done:
            if self._leading:
                await self._turn.wait()
            else:
                await self._lead()

    async def _lead(self) -> None:
        """Run the next batch (the oldest queued calls) in a worker thread."""
        self._leading = True
        batch = self._queue[: self._max_batch]
        del self._queue[: self._max_batch]
        for call in batch:
            call.taken = True
        try:
            # Not abandoned on cancel: the connection must not be reused while
            # a thread still runs on it. The calls' deadlines bound the batch.
            await anyio.to_thread.run_sync(self._run_answered, batch)
        finally:
            unanswered = [call for call in batch if not call.done]  # cancelled before it ran
            for call in unanswered:
                call.taken = False
            self._queue[:0] = unanswered
            self._hand_over()

    def _run_answered(self, batch: list[Call[object]]) -> None:
        """Run ``batch``; a failure of ``run_batch`` itself answers every call it left."""
        try:
            self._run_batch(batch)
        except BaseException as exc:  # delivered to each caller instead
            for call in batch:
                if not call.done:
                    call.fail(exc)

    def _hand_over(self) -> None:
        self._leading = False
        turn, self._turn = self._turn, anyio.Event()
        turn.set()
