"""``memory://``: the completion store in this process's memory, for tests and demos.

Same fencing, claim and identity rules as the durable backends, but neither
durable nor shared between pods; every call is atomic on its event loop.
See docs/design.md#the-memory-store.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import final

import anyio

from ..._errors import StoreUnavailable
from .._bell import OutboxBell
from .._effect_rows import PRUNE_LIMIT, OutboxEntry, OutboxRow, Params
from .._fencing import (
    NO_FENCE,
    ClaimResult,
    Completion,
    CompletionRequest,
    CompletionResult,
    Head,
    answer_to,
    check_call,
    claim_answer,
    completion_params,
    decide,
    decide_claim,
    highest,
)
from ._memory_effects import MemoryOutbox, MemoryTransaction


@dataclass(frozen=True, slots=True)
class _Row:
    """One recorded completion, its result kept as the JSON text a database would hold."""

    fence: int
    result: str
    execution_id: str
    pod: str
    completed_at: datetime
    cpu_seconds: float | None = None
    peak_memory: int | None = None

    def completion(self, job_key: str, input_version: str) -> Completion:
        return Completion(
            job_key=job_key,
            input_version=input_version,
            fence=self.fence,
            result=json.loads(self.result),
            execution_id=self.execution_id,
            pod=self.pod,
            completed_at=self.completed_at,
            cpu_seconds=self.cpu_seconds,
            peak_memory=self.peak_memory,
        )


@final
class MemoryStore:
    """A :class:`~leaseworker.CompletionStore` held in a dict; see the module docstring."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str], _Row] = {}
        self._heads: dict[str, Head] = {}
        self._claims: dict[str, int] = {}  # job key -> highest claimed fence
        self._locks: dict[str, anyio.Event] = {}  # job keys a transaction holds, set on its end
        self.outbox_rows = MemoryOutbox()
        self.statements: list[tuple[str, Params]] = []  # of committed transactions, in order
        self.outbox_bell = OutboxBell()
        self._closed = False

    def settled_by_offsets(self) -> MemoryStore:
        """Return this store: its answers are as final as they get when given."""
        return self

    async def durable(self) -> None:
        """Return at once: there is no disk to wait for (and nothing outlives the process)."""

    async def complete(self, request: CompletionRequest) -> CompletionResult:
        """Record a completion if the fence allows; see ``CompletionStore.complete``."""
        params = completion_params(request)
        self._check_open(request.job_key)
        await self._unlocked(request.job_key)
        return self.record(request, params)

    def record(
        self, request: CompletionRequest, params: dict[str, object] | None = None
    ) -> CompletionResult:
        """Apply ``decide``; record an accepted completion at once (the caller holds the key).

        ``params``: the request's :func:`completion_params`, if the caller checked it already.
        """
        params = completion_params(request) if params is None else params
        key, version = request.job_key, request.input_version
        self._check_open(key)
        standing = self._find(key, version)
        head = self._heads.get(key)
        claimed = self._claims.get(key, NO_FENCE)
        status = decide(standing, head, request.fence, claimed=claimed)
        if status != "accepted":
            # duplicate: this identity's completion; stale: the one that won, if any
            winner = standing or (None if head is None else self._find(key, head.input_version))
            return answer_to(
                request, status, winning_fence=highest(head, claimed), completion=winner
            )
        row = _Row(
            request.fence,
            str(params["result"]),
            request.execution_id,
            request.pod,
            datetime.now(UTC),
            request.cpu_seconds,
            request.peak_memory,
        )
        self._rows[(key, version)] = row
        self._heads[key] = Head(fence=request.fence, input_version=version)
        return answer_to(
            request,
            status,
            winning_fence=request.fence,
            completion=row.completion(key, version),
        )

    async def claim(self, job_key: str, input_version: str, fence: int) -> ClaimResult:
        """Raise the job key's claimed fence to ``fence``; see ``CompletionStore.claim``."""
        check_call(job_key, fence, input_version)
        self._check_open(job_key)
        await self._unlocked(job_key)
        standing = self._find(job_key, input_version)
        head = self._heads.get(job_key)
        claimed = self._claims.get(job_key, NO_FENCE)
        status = decide_claim(standing, head, fence, claimed=claimed)
        self._claims[job_key] = max(claimed, fence)
        return ClaimResult(
            status=status,
            job_key=job_key,
            input_version=input_version,
            fence=fence,
            highest_fence=highest(head, self._claims[job_key]),
            completion=standing,
        )

    @asynccontextmanager
    async def transaction(
        self,
        job_key: str,
        input_version: str,
        fence: int,
        *,
        budget: Callable[[], float] | None = None,
    ) -> AsyncIterator[MemoryTransaction]:
        """Hold ``job_key`` as a head row lock would; see ``EffectStore.transaction``.

        Claims, completions and transactions of the key wait until the block ends;
        ``budget`` is not needed (nothing here outlives the pod).
        """
        check_call(job_key, fence, input_version)
        self._check_open(job_key)
        await self._unlocked(job_key)
        self._locks[job_key] = released = anyio.Event()
        try:
            standing = self._find(job_key, input_version)
            head = self._heads.get(job_key)
            claimed = self._claims.get(job_key, NO_FENCE)
            opened = claim_answer(
                job_key, input_version, fence, standing=standing, head=head, claimed=claimed
            )
            yield MemoryTransaction(self, opened)
        finally:
            del self._locks[job_key]
            released.set()

    async def claim_outbox(self, relay: str, *, limit: int, hold: float) -> list[OutboxRow]:
        """Claim unsent messages; see ``EffectStore.claim_outbox``."""
        self._check_open(None)
        return self.outbox_rows.claim(relay, limit=limit, hold=hold)

    async def mark_sent(self, relay: str, ids: Sequence[int]) -> int:
        """Mark claimed messages sent; see ``EffectStore.mark_sent``."""
        self._check_open(None)
        return self.outbox_rows.mark_sent(relay, ids)

    async def release_outbox(self, relay: str, ids: Sequence[int]) -> None:
        """Give up claims; see ``EffectStore.release_outbox``."""
        self._check_open(None)
        self.outbox_rows.release(relay, ids)

    async def outbox(self, job_key: str | None = None) -> list[tuple[OutboxRow, bool]]:
        """Every outbox row with whether it was sent; see ``EffectStore.outbox``."""
        return self.outbox_rows.rows(job_key)

    async def outbox_entries(self, job_key: str | None = None) -> list[OutboxEntry]:
        """Every outbox row with its state; see ``EffectStore.outbox_entries``."""
        return self.outbox_rows.entries(job_key)

    async def outbox_backlog(self, prefix: str = "") -> tuple[int, float | None]:
        """Unsent messages and the oldest one's age; see ``EffectStore.outbox_backlog``."""
        self._check_open(None)
        return self.outbox_rows.backlog(prefix)

    async def prune_outbox(self, older_than: float, *, limit: int = PRUNE_LIMIT) -> int:
        """Delete nothing: a ``memory://`` store lives as long as its test or process."""
        self._check_open(None)
        return 0

    async def lookup(self, job_key: str, input_version: str) -> Completion | None:
        """Return this identity's completion, or ``None``."""
        return (await self.lookup_many([(job_key, input_version)]))[0]

    async def lookup_many(self, identities: Sequence[tuple[str, str]]) -> list[Completion | None]:
        """Return each identity's completion, or ``None``; see ``CompletionStore.lookup_many``."""
        for job_key, input_version in identities:
            check_call(job_key, 0, input_version)
        self._check_open(identities[0][0] if identities else None)
        return [self._find(key, version) for key, version in identities]

    async def state(self, job_key: str) -> Completion | None:
        """Return the job key's winning completion, or ``None``."""
        check_call(job_key, 0)
        self._check_open(job_key)
        head = self._heads.get(job_key)
        if head is None:
            return None
        return self._rows[(job_key, head.input_version)].completion(job_key, head.input_version)

    async def aclose(self) -> None:
        """Forget everything; further calls raise :class:`StoreUnavailable`."""
        self._closed = True
        self._rows.clear()
        self._heads.clear()
        self._claims.clear()
        self.outbox_rows.clear()
        self.statements.clear()

    def _find(self, job_key: str, input_version: str) -> Completion | None:
        row = self._rows.get((job_key, input_version))
        return None if row is None else row.completion(job_key, input_version)

    async def _unlocked(self, job_key: str) -> None:
        """Wait while a transaction holds ``job_key`` (as for a PostgreSQL row lock)."""
        while (held := self._locks.get(job_key)) is not None:
            await held.wait()

    def _check_open(self, job_key: str | None) -> None:
        if self._closed:
            raise StoreUnavailable(job_key, "the store is closed")

    def __repr__(self) -> str:
        return f"MemoryStore(completions={len(self._rows)})"
