"""The completion store of a ``JobEnvironment``: the ``memory://`` store, plus faults.

A :class:`~leaseworker.CompletionStore` wrapping the in-memory store the
``memory://`` URL opens (same fencing, claim and identity rules as the durable
ones), able to be down for a number of calls and to run a hook just before a
completion (another pod's takeover).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Literal, final

from .._errors import StoreUnavailable
from .._store import (
    PRUNE_LIMIT,
    ClaimResult,
    Completion,
    CompletionRequest,
    CompletionResult,
    CompletionStore,
    OutboxBell,
    OutboxEntry,
    OutboxRow,
    StoreTransaction,
    effect_store,
)

StoreCall = Literal["complete", "lookup", "claim"]
"""A store call an outage can hit (:class:`~leaseworker.testing.StoreOutage`)."""

BeforeComplete = Callable[[CompletionStore, CompletionRequest], Awaitable[None]]
"""Run once, with the inner store, just before the next completion is written."""


@final
class FaultyStore:
    """A :class:`~leaseworker.CompletionStore` forwarding to ``inner``, unless a fault says no.

    ::

        store = FaultyStore(inner)
        store.outage("complete", calls=2)     # the next two completions: StoreUnavailable
        store.before_next_complete(takeover)  # another pod's claim, just before ours

    ``JobEnvironment`` injects its store faults through it, as it injects lease
    faults through :class:`MemoryLeases`.
    """

    def __init__(self, inner: CompletionStore) -> None:
        self.inner = inner
        self._outages: dict[StoreCall, int] = {}
        self._before_complete: BeforeComplete | None = None

    @property
    def outbox_bell(self) -> OutboxBell:
        """The inner store's bell (its relay's): rung by commits made through this store."""
        return effect_store(self.inner).outbox_bell

    def settled_by_offsets(self) -> FaultyStore:
        """Return this store: it forwards to ``inner`` as it is, answers durable when given."""
        return self

    async def durable(self) -> None:
        """Return at once: the inner store's answers reach this one durable already."""

    def outage(self, during: StoreCall, calls: int) -> None:
        """Make the next ``calls`` calls of kind ``during`` raise :class:`StoreUnavailable`."""
        self._outages[during] = self._outages.get(during, 0) + calls

    def clear(self) -> None:
        """Forget outages and hooks not used up yet."""
        self._outages.clear()
        self._before_complete = None

    def before_next_complete(self, hook: BeforeComplete) -> None:
        """Run ``hook`` once, just before the next completion."""
        self._before_complete = hook

    async def complete(self, request: CompletionRequest) -> CompletionResult:
        """Record ``request``'s completion (see ``CompletionStore.complete``)."""
        self._check("complete", request.job_key)
        hook, self._before_complete = self._before_complete, None
        if hook is not None:
            await hook(self.inner, request)
        return await self.inner.complete(request)

    async def claim(self, job_key: str, input_version: str, fence: int) -> ClaimResult:
        """Claim the job key with ``fence`` (see ``CompletionStore.claim``)."""
        self._check("claim", job_key)
        return await self.inner.claim(job_key, input_version, fence)

    async def lookup(self, job_key: str, input_version: str) -> Completion | None:
        """Return this identity's completion, or ``None``."""
        return (await self.lookup_many([(job_key, input_version)]))[0]

    async def lookup_many(self, identities: Sequence[tuple[str, str]]) -> list[Completion | None]:
        """Return each identity's completion, or ``None``; an outage of ``lookup`` hits the call."""
        self._check("lookup", identities[0][0] if identities else "")
        return await self.inner.lookup_many(identities)

    @contextlib.asynccontextmanager
    async def transaction(
        self,
        job_key: str,
        input_version: str,
        fence: int,
        *,
        budget: Callable[[], float] | None = None,
    ) -> AsyncIterator[StoreTransaction]:
        """Open a job's transaction; an outage of ``complete`` and the takeover hook hit it too."""
        self._check("complete", job_key)
        hook, self._before_complete = self._before_complete, None
        if hook is not None:  # the takeover lands just before the transaction
            await hook(self.inner, _opening(job_key, input_version, fence))
        inner = effect_store(self.inner)
        async with inner.transaction(job_key, input_version, fence, budget=budget) as tx:
            yield tx

    async def claim_outbox(self, relay: str, *, limit: int, hold: float) -> list[OutboxRow]:
        """Claim unsent messages (see ``EffectStore.claim_outbox``)."""
        return await effect_store(self.inner).claim_outbox(relay, limit=limit, hold=hold)

    async def mark_sent(self, relay: str, ids: Sequence[int]) -> int:
        """Mark claimed messages sent."""
        return await effect_store(self.inner).mark_sent(relay, ids)

    async def release_outbox(self, relay: str, ids: Sequence[int]) -> None:
        """Give up claims."""
        await effect_store(self.inner).release_outbox(relay, ids)

    async def outbox(self, job_key: str | None = None) -> list[tuple[OutboxRow, bool]]:
        """Every outbox row with whether it was sent."""
        return await effect_store(self.inner).outbox(job_key)

    async def outbox_entries(self, job_key: str | None = None) -> list[OutboxEntry]:
        """Every outbox row with its state."""
        return await effect_store(self.inner).outbox_entries(job_key)

    async def outbox_backlog(self, prefix: str = "") -> tuple[int, float | None]:
        """Unsent messages (of job keys starting with ``prefix``) and the oldest one's age."""
        return await effect_store(self.inner).outbox_backlog(prefix)

    async def prune_outbox(self, older_than: float, *, limit: int = PRUNE_LIMIT) -> int:
        """Delete old sent messages."""
        return await effect_store(self.inner).prune_outbox(older_than, limit=limit)

    async def state(self, job_key: str) -> Completion | None:
        """Return the job key's winning completion, or ``None``."""
        return await self.inner.state(job_key)

    async def aclose(self) -> None:
        """Close the inner store."""
        await self.inner.aclose()

    def _check(self, call: StoreCall, job_key: str) -> None:
        left = self._outages.get(call, 0)
        if left > 0:
            self._outages[call] = left - 1
            raise StoreUnavailable(job_key, f"injected outage of {call} (leaseworker.testing)")


def _opening(job_key: str, input_version: str, fence: int) -> CompletionRequest:
    """Return the request a takeover hook sees for a transaction: identity, fence, no result."""
    return CompletionRequest(
        job_key=job_key,
        input_version=input_version,
        fence=fence,
        result=None,
        execution_id="opening",
        pod="opening",
    )
