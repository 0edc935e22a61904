"""Releases asked for in one event-loop turn go together: batches, a task and a trip each.

When many held blocks end at once (a burst of jobs finishing), each would
otherwise send its own release, queue behind the others and wait for its
turn on a loop busy ending the rest. A store with ``release_many(leases)``
(``RedisLeases``) gets the releases of the turn in batches instead (of
:data:`BATCH`), sent on the next turn. A release's timeout starts when its
batch is sent, not when its block asked: a release that waited on a busy
loop, without being sent, has not failed. The store bounds each trip
(``RedisLeases``: the command timeout, from when the trip is written); for a
store that does not, the batches of one turn are bounded too, the n-th by n
times :data:`BATCH_BOUND` times ``release_timeout``: its trip may go after the
n - 1 ahead of it on the store's one connection (``RedisLeases`` pipelines
them), each of those answered within the same bound. A release that does
fail leaves the lease to expire with its TTL (the owner-checked scripts keep
that safe) and is reported by its ``HeldLease``. A failed release is sent
once more, in a batch of the failed ones with a bound of its own (the same
n-th): a trip whose bound ran out while the
loop was busy ending thousands of bodies (its reply not yet read) mostly
succeeds on the next try. Sending it again is safe: the script deletes only this
owner's lease. The first trip may have deleted it, though, with its answer
unread; the second then finds the key gone and answers ``False``. A lease
still inside its local deadline cannot have expired or passed to another
owner, so a ``False`` from the second trip sent inside that deadline counts
as the first trip's delete: ``True``.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Sequence

from ._model import Lease
from ._per_loop import PerLoop
from ._timing import now

BATCH = 1000
"""The most releases in one batch: a trip short enough to stay well inside its timeout."""

BATCH_BOUND = 2
"""A batch's own trip may take this many times ``release_timeout`` (for a store with no bound)."""

ReleaseMany = Callable[[Sequence[Lease]], Awaitable[Sequence["bool | BaseException"]]]
"""A store's optional ``release_many(leases)``: one answer per lease, an exception for a failure."""

_Pending = list[tuple[Lease, "asyncio.Future[bool]"]]


class Releases:
    """The releases of one event loop waiting for the next turn, by store and timeout."""

    __slots__ = ("__weakref__", "_pending", "_tasks")

    def __init__(self) -> None:
        self._pending: dict[tuple[ReleaseMany, float], _Pending] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # strong references while they run

    def release(self, many: ReleaseMany, lease: Lease, timeout: float) -> asyncio.Future[bool]:
        """Queue ``lease``'s release; the future answers ``release()``'s answer or its error."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[bool] = loop.create_future()
        if not self._pending:
            # In a context of its own: a batch must not carry one body's context variables.
            loop.call_soon(self._send, context=contextvars.Context())
        self._pending.setdefault((many, timeout), []).append((lease, answer))
        return answer

    def _send(self) -> None:
        """Send each store's queued releases as one batch (a loop callback)."""
        pending, self._pending = self._pending, {}
        loop = asyncio.get_running_loop()
        for (many, timeout), queued in pending.items():
            for n, first in enumerate(range(0, len(queued), BATCH), start=1):
                batch = queued[first : first + BATCH]
                within = n * BATCH_BOUND * timeout  # after the n - 1 batches ahead of it
                task = loop.create_task(_release_many(many, batch, within))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)


async def _release_many(many: ReleaseMany, batch: _Pending, within: float) -> None:
    leases = [lease for lease, _ in batch]
    try:
        answers = await _ask(many, leases, within)
        failed = [i for i, answer in enumerate(answers) if isinstance(answer, BaseException)]
        if failed:  # once more, the failed ones together, with a bound of their own
            sent = now()
            again = await _ask(many, [leases[i] for i in failed], within)
            for i, answer in zip(failed, again, strict=True):
                if answer is False and sent < leases[i].local_deadline:
                    answer = True  # gone inside its deadline: the first trip deleted it
                answers[i] = answer
    except asyncio.CancelledError:  # the loop is closing: nobody may wait for ever
        answers = [TimeoutError("the release was cancelled before it was answered") for _ in batch]
        _answer(batch, answers)
        raise
    _answer(batch, answers)


async def _ask(many: ReleaseMany, leases: list[Lease], within: float) -> list[bool | BaseException]:
    """One ``release_many`` trip bounded by ``within``; a custom store's bug is each one's error."""
    try:
        async with asyncio.timeout(within):
            return list(await many(leases))
    except TimeoutError:
        return [TimeoutError(f"release did not finish within {within}s") for _ in leases]
    except Exception as exc:
        return [exc] * len(leases)


def _answer(batch: _Pending, answers: Sequence[bool | BaseException]) -> None:
    for (_, answer), released in zip(batch, answers, strict=True):
        if answer.done():
            continue
        if isinstance(released, BaseException):
            answer.set_exception(released)
        else:
            answer.set_result(released)


releases = PerLoop(Releases)
"""Return the running event loop's release batcher (made on first use)."""
