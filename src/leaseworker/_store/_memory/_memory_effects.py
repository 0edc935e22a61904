"""``memory://``'s transactions and outbox: the durable stores' rules, in this process.

A transaction holds its job key as a head row lock would (the store's other
calls of the key wait for it), runs no SQL (it records each statement for
tests to read) and commits by recording the completion and the messages at
once. The outbox keeps rows in commit order and applies the relays' claim
rule of the durable stores. See docs/effects.md.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, final

from ..._errors import StoreUnavailable
from .._effect_rows import Message, OutboxEntry, OutboxRow, Params, pick_claims
from .._fencing import ClaimResult, CompletionRequest, CompletionResult


@dataclass(slots=True)
class _Entry:
    row: OutboxRow
    claimed_by: str | None = None
    claimed_until: float = 0.0
    sent: bool = False
    committed_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    sent_at: datetime | None = None
    attempts: int = 0


@final
class MemoryOutbox:
    """Committed messages in commit order, with the relays' claims (monotonic clock)."""

    def __init__(self) -> None:
        self._entries: list[_Entry] = []

    def add(self, request: CompletionRequest, messages: Sequence[Message]) -> None:
        """Append the committed ``messages`` of ``request``'s execution."""
        for seq, message in enumerate(messages):
            row = OutboxRow(
                id=len(self._entries) + 1,
                job_key=request.job_key,
                input_version=request.input_version,
                seq=seq,
                fence=request.fence,
                message=message,
            )
            self._entries.append(_Entry(row))

    def claim(self, relay: str, *, limit: int, hold: float) -> list[OutboxRow]:
        """Claim as ``EffectStore.claim_outbox`` says: a key's rows only with its earlier ones."""
        clock = time.monotonic()
        unsent = [
            (e.row.id, e.row.job_key, e.claimed_by, e.claimed_until)
            for e in self._entries
            if not e.sent
        ]
        taken = self._by_id(pick_claims(unsent, relay, now=clock, limit=limit))
        for entry in taken:
            entry.claimed_by, entry.claimed_until = relay, clock + hold
            entry.attempts += 1
        return [entry.row for entry in taken]

    def mark_sent(self, relay: str, ids: Sequence[int]) -> int:
        """Mark ``relay``'s claimed rows ``ids`` sent; return how many were."""
        marked = 0
        for entry in self._by_id(ids):
            if entry.claimed_by == relay and not entry.sent:
                entry.sent, marked = True, marked + 1
                entry.sent_at = datetime.now(UTC)
        return marked

    def release(self, relay: str, ids: Sequence[int]) -> None:
        """Drop ``relay``'s claims on ``ids``."""
        for entry in self._by_id(ids):
            if entry.claimed_by == relay:
                entry.claimed_by, entry.claimed_until = None, 0.0

    def entries(self, job_key: str | None = None) -> list[OutboxEntry]:
        """Every row (of ``job_key``) with its state."""
        return [
            OutboxEntry(
                row=e.row,
                committed_at=e.committed_at,
                sent_at=e.sent_at,
                attempts=e.attempts,
                sent_by=e.claimed_by if e.sent else None,
            )
            for e in self._entries
            if job_key is None or e.row.job_key == job_key
        ]

    def rows(self, job_key: str | None = None) -> list[tuple[OutboxRow, bool]]:
        """Every row (of ``job_key``) with whether it was sent."""
        return [(entry.row, entry.sent) for entry in self.entries(job_key)]

    def backlog(self, prefix: str = "") -> tuple[int, float | None]:
        """Return the unsent rows' count (job keys starting with ``prefix``), the oldest's age."""
        unsent = [
            e.committed_at for e in self._entries if not e.sent and e.row.job_key.startswith(prefix)
        ]
        if not unsent:
            return 0, None
        return len(unsent), (datetime.now(UTC) - min(unsent)).total_seconds()

    def clear(self) -> None:
        """Forget every row."""
        self._entries.clear()

    def _by_id(self, ids: Sequence[int]) -> list[_Entry]:
        return [self._entries[i - 1] for i in ids if 0 < i <= len(self._entries)]


class Ledger(Protocol):
    """What a transaction commits into (the ``memory://`` store): completions, rows, statements."""

    outbox_rows: MemoryOutbox
    statements: list[tuple[str, Params]]

    def record(
        self, request: CompletionRequest, params: dict[str, object] | None = None
    ) -> CompletionResult:
        """Apply the fencing rule to ``request``; record it if accepted (the key is held)."""
        ...


@final
class MemoryTransaction:
    """A ``memory://`` transaction: statements recorded, completion and messages at commit."""

    def __init__(self, store: Ledger, opened: ClaimResult) -> None:
        self._store = store
        self.opened = opened
        self.statements: list[tuple[str, Params]] = []
        self.hold_limit: float | None = None  # nothing else waits behind it
        self.committed = False

    @property
    def connection(self) -> Any:
        """``None``: ``memory://`` has no database connection."""
        return None

    async def execute(self, sql: str, params: Params = None) -> list[tuple[Any, ...]]:
        """Record the statement (nothing runs); return no rows."""
        self._check()
        self.statements.append((sql, params))
        return []

    async def commit(
        self, request: CompletionRequest, messages: Sequence[Message]
    ) -> CompletionResult:
        """Record the completion (the key is held: nothing can interleave) and the messages."""
        self._check()
        self.committed = True
        answer = self._store.record(request)
        if answer.status == "accepted":
            self._store.outbox_rows.add(request, messages)
            self._store.statements.extend(self.statements)
        return answer

    def _check(self) -> None:
        if self.committed or self.opened.status != "claimed":
            raise StoreUnavailable(self.opened.job_key, "the transaction is not open")
