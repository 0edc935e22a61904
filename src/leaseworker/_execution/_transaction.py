"""A job's effects in the completion's transaction: ``ctx.transaction()`` and ``ctx.publish()``.

``transaction(completer)`` opens one transaction in the completion store's
database that holds the job key's head lock and refuses (nothing written,
:class:`~leaseworker.effects.TransactionRefused`) when a fence above this
execution's has been seen; the job's statements run on it, and its
completion and messages are recorded in it when the block ends. A job that
only publishes gets the same transaction at its completion
(:func:`complete_with_messages`). See docs/effects.md.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, final

import anyio

from .._errors import StoreUnavailable, TransactionRefused
from .._lease import now
from .._retry import Retries
from .._store import (
    ClaimResult,
    CompletionResult,
    EffectStore,
    Params,
    Status,
    StoreTransaction,
    answer_to,
    effect_store,
)
from ._result_checks import check_result

if TYPE_CHECKING:
    from ._completion import Completer

Headers = Mapping[str, str | bytes] | Sequence[tuple[str, str | bytes]]
"""A message's own headers: a mapping or ``(name, value)`` pairs; ``str`` values as UTF-8."""

_UNSET: Any = object()


@final
class Transaction:
    """The transaction ``async with ctx.transaction() as tx:`` gives the job.

    ::

        async with ctx.transaction() as tx:
            await tx.execute("INSERT INTO report (tenant, total) VALUES (%s, %s)", (t, total))
            tx.publish("reports.ready", {"tenant": t}, key=t)
            tx.complete({"total": total})
        # committed here, with the completion: tx.answer.status == "accepted"

    ``tx.complete(result)`` names the execution's result; the block's end
    records it with the statements and messages, in one commit. A block
    that ends without ``complete`` raises ``RuntimeError`` and writes
    nothing. ``execute`` takes the driver's placeholders (``%s`` on
    PostgreSQL, ``?`` on SQLite); ``connection`` is psycopg's connection on
    PostgreSQL (``sqlite3``'s on SQLite, ``None`` on ``memory://``).
    """

    def __init__(self, store_tx: StoreTransaction, completer: Completer) -> None:
        self._tx = store_tx
        self._completer = completer
        self.result: Any = _UNSET
        self.answer: CompletionResult | None = None

    @property
    def connection(self) -> Any:
        """The database driver's connection, inside this transaction."""
        return self._tx.connection

    @property
    def statements(self) -> list[tuple[str, Params]]:
        """The job's statements run on this transaction so far, with their parameters."""
        return self._tx.statements

    async def execute(self, sql: str, params: Params = None) -> list[tuple[Any, ...]]:
        """Run one statement in the transaction; return its rows (``[]`` when it has none).

        It runs while the lease holds, renewals included; on PostgreSQL it is
        ended on the server when the execution's scope fires. Raises
        :class:`~leaseworker.LeaseLost` first if the lease is already uncertain.
        """
        held = self._completer.held
        if not held.owned:  # not a checkpoint of the job's own: only a known loss counts
            await held.checkpoint()
        return await self._tx.execute(sql, params)

    def publish(
        self,
        topic: str,
        value: object,
        *,
        key: str | bytes | None = None,
        headers: Headers | None = None,
    ) -> str:
        """Add a message to the outbox, sent once this transaction commits; return its effect id."""
        return self._completer.publish(topic, value, key=key, headers=headers)

    def complete(self, result: object) -> None:
        """Name this execution's result (JSON); it is recorded when the block ends."""
        check_result(self._completer.held.key, result, max_bytes=self._completer.max_result_bytes)
        if self.result is not _UNSET:
            raise RuntimeError("tx.complete() was already called; an execution completes once")
        self.result = result


@contextlib.asynccontextmanager
async def transaction(completer: Completer) -> AsyncIterator[Transaction]:
    """Open the job's transaction, run the block on it, commit the completion at its end.

    A block that fails before the store answered does not count as the
    execution's completion: its messages are dropped, and a job that goes on
    and returns is completed with ``run()``'s return value, as without one.
    """
    store = _effect_store(completer)
    mark = len(completer.messages)
    completer.begin()
    try:
        async with contextlib.AsyncExitStack() as stack:
            store_tx = await _open(completer, store, stack)
            tx = Transaction(store_tx, completer)
            limit = store_tx.hold_limit
            with anyio.CancelScope(deadline=math.inf if limit is None else now() + limit) as block:
                yield tx
            _check_held(block, completer, store, limit)
            tx.answer = await _commit(completer, store, store_tx, _named(tx, completer))
    except BaseException:
        if completer.result is None:  # nothing was decided: as if it never began
            completer.undo(mark)
        raise


async def complete_with_messages(completer: Completer, result: object) -> CompletionResult:
    """Record ``result`` and the messages ``ctx.publish`` added, in one transaction.

    Retried whole while the lease holds: a commit whose answer was lost is
    found by the next try (``duplicate`` with this execution's id: its own).
    """
    store = _effect_store(completer)
    retries = Retries(completer.retry)
    while True:
        try:
            async with contextlib.AsyncExitStack() as stack:
                store_tx = await _open(completer, store, stack)
                return await _commit(completer, store, store_tx, result)
        except TransactionRefused:
            assert completer.result is not None
            return completer.result
        except StoreUnavailable as exc:
            await retries.wait(functools.partial(completer.failed, completer.held.fence, exc))
            await completer.held.checkpoint()


async def _open(
    completer: Completer, store: EffectStore, stack: contextlib.AsyncExitStack
) -> StoreTransaction:
    """Begin, retrying while the store is down and the lease holds; raise if refused."""
    fence = completer.held.fence
    retries = Retries(completer.retry)
    while True:
        begun = now()
        try:
            store_tx: StoreTransaction = await stack.enter_async_context(
                store.transaction(
                    completer.key, completer.input_version, fence, budget=completer.held.remaining
                )
            )
            break
        except StoreUnavailable as exc:
            await retries.wait(functools.partial(completer.failed, fence, exc))
            await completer.held.checkpoint()  # LeaseLost once ownership is uncertain
    opened = store_tx.opened
    if opened.status != "claimed":
        completer.answered(_refusal(completer, opened), begun)
        raise TransactionRefused(
            completer.held.key, status=opened.status, fence=fence, seen=opened.highest_fence
        )
    return store_tx


async def _commit(
    completer: Completer, store: EffectStore, store_tx: StoreTransaction, result: object
) -> CompletionResult:
    """Commit the completion and the messages; the store's answer decides (shielded)."""
    request = completer.request(result)
    if not completer.held.owned:  # past the local deadline (a blocked loop): commit nothing
        await completer.held.checkpoint()
    begun = now()
    with anyio.CancelScope(shield=True):  # bounded by the store's timeout and the lease
        committed = await store_tx.commit(request, tuple(completer.messages))
    answer = completer.answered(committed, begun)
    if answer.status == "accepted" and completer.messages:
        store.outbox_bell.ring()  # this pod's relay sends them now, not at its next poll
    return answer


def _named(tx: Transaction, completer: Completer) -> object:
    """Return the result ``tx.complete`` named; raise if the block ended without one."""
    if tx.result is _UNSET:
        raise RuntimeError(
            f"the transaction of {completer.held.key!r} ended without tx.complete(result): "
            "nothing was written"
        )
    return tx.result


def _check_held(
    block: anyio.CancelScope, completer: Completer, store: EffectStore, limit: float | None
) -> None:
    """Raise if ``block`` was stopped for holding the store past its ``hold_limit`` (SQLite)."""
    if not block.cancelled_caught:
        return
    raise RuntimeError(
        f"the transaction of {completer.held.key!r} was stopped after {limit}s: "
        f"{type(store).__name__} lets a job's block hold its connection that long at most "
        "(half the store's timeout; the pod's other store calls wait behind it); nothing was "
        "written: keep the block short, or use PostgreSQL"
    )


def _refusal(completer: Completer, opened: ClaimResult) -> CompletionResult:
    """Return the completion answer a refused transaction stands for (stale or duplicate)."""
    status: Status = "duplicate" if opened.status == "duplicate" else "stale"
    request = completer.request(None)
    return answer_to(
        request, status, winning_fence=opened.highest_fence, completion=opened.completion
    )


def _effect_store(completer: Completer) -> EffectStore:
    return effect_store(completer.store)
