"""The PostgreSQL completion store: psycopg 3, async, over a connection pool.

Each completion is a call of the ``leaseworker_complete()`` server function,
and each claim one of ``leaseworker_claim()``: both lock the job key's head
row, then read and write. Lookups, claims and completions that wait together
go as one batch (:mod:`.._batch`): one call of ``leaseworker_calls()``, one
round trip and one transaction for all of them. Every call has one deadline.
Why that is race-free, and the bounds: see docs/design.md#the-postgresql-store.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Literal, cast, final

import anyio
import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from ..._errors import StoreUnavailable
from ..._secrets import SecretFile
from .._bell import OutboxBell
from .._effect_rows import PRUNE_LIMIT, OutboxEntry, OutboxRow, StoreTransaction
from .._fencing import (
    ClaimResult,
    Completion,
    CompletionRequest,
    CompletionResult,
    answer_to,
    check_call,
    completion_params,
)
from .._group_commit import Batcher, Call
from .._migration import Migration
from .._schema import MIGRATIONS
from .._url import StoreURL
from . import _pg_effects
from ._pg_claims import MARK, RELEASE, OutboxClaims, relay_share
from ._pg_pool import Attempt, Conn, PgPool, SessionSetup, completion_of, maybe_completion_of
from ._pg_schema import first_connection, migrate, reread_url
from ._pg_standby import warn_unless_waited_for
from ._pg_takeover import ending_older_holders

_CALLS = "SELECT * FROM leaseworker_calls(%s::jsonb)"
MAX_BATCH = 64
"""Calls per trip to the database."""

BATCHES_IN_FLIGHT = 1
"""Batches a store runs at once, each on its own pooled connection.

One: a second in flight halves the batches' sizes (measured in a pod at
concurrency 16: 0.42 to 0.76 batches per trigger, about 8 % more CPU), and
would only help while a batch waits for a head row another session holds.
"""

_STATE = """
    SELECT c.input_version, c.fence, c.result, c.execution_id, c.pod, c.completed_at,
           c.cpu_seconds, c.peak_memory
    FROM leaseworker_jobs j
    JOIN leaseworker_completions c
      ON c.job_key = j.job_key AND c.input_version = j.input_version
    WHERE j.job_key = %s
"""


@final
class PostgresStore:
    """Completions in PostgreSQL; open it with ``open_store("postgresql://...")``.

    ``call_timeout`` bounds every call (pool checkout included); ``max_connections``
    caps the pool, of which the relay (its claims and prunes) holds
    ``relay_connections`` at most (default: :func:`relay_share`).
    ``schema_version`` is the database's schema version after the start-up
    migration.
    """

    def __init__(self, pool: PgPool, relay_connections: int) -> None:
        self._pool = pool
        self._batcher = Batcher(
            self._run_batch, max_batch=MAX_BATCH, max_in_flight=BATCHES_IN_FLIGHT
        )
        # This process's claims of the outbox, on a bounded share of the pool.
        self._claims = OutboxClaims(pool, relay_connections)
        self.outbox_bell = OutboxBell()
        self.schema_version = 0

    @classmethod
    async def open(
        cls,
        url: StoreURL,
        *,
        call_timeout: float,
        max_connections: int = 10,
        relay_connections: int | None = None,
        migrations: Sequence[Migration] = MIGRATIONS,
        source: SecretFile | None = None,
        oldest_beside: int = 0,
    ) -> PostgresStore:
        """Connect, then create or migrate the schema; raise StoreUnavailable on failure.

        ``source``: the file ``url`` came from, read again for every new connection.
        ``oldest_beside``: a schema from 1 to below it is refused, not migrated
        (``open_store`` passes the oldest release's this code runs beside).
        """
        pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            url.target if source is None else functools.partial(reread_url, source, url),
            open=False,
            min_size=1,
            max_size=max_connections,
            name="leaseworker-completions",
            timeout=call_timeout,
            # A failed reconnection backs off 1, 2, 4 s... for this long, then the next
            # call starts a fresh one at once: after a promotion (a multi-host URL's
            # read-write node moved) the store answers at the next call, not seconds later.
            reconnect_timeout=call_timeout,
            kwargs={"autocommit": True, "connect_timeout": max(2, math.ceil(call_timeout))},
            configure=SessionSetup(call_timeout),
        )
        share = relay_share(max_connections) if relay_connections is None else relay_connections
        store = cls(PgPool(pool, shown_url=url.redacted, call_timeout=call_timeout), share)
        try:
            await first_connection(url, call_timeout)
            try:
                await pool.open(wait=True, timeout=call_timeout)
            except psycopg.Error as exc:
                raise StoreUnavailable(
                    None, f"cannot connect to {url.redacted} within {call_timeout}s"
                ) from exc
            where = f"completion store at {url.redacted}"
            store.schema_version = await store._pool.run(
                None, lambda conn, attempt: migrate(conn, migrations, where, oldest_beside)
            )
            await store._pool.run(None, lambda conn, attempt: warn_unless_waited_for(conn, where))
        except BaseException:
            with anyio.CancelScope(shield=True):
                await pool.close(timeout=call_timeout)
            raise
        return store

    def settled_by_offsets(self) -> PostgresStore:
        """Return this store: every answer is durable when given (committed, synchronous)."""
        return self

    async def durable(self) -> None:
        """Return at once: what the store answered was committed before the answer."""

    async def complete(self, request: CompletionRequest) -> CompletionResult:
        """Record a completion if the fence allows; see ``CompletionStore.complete``."""
        params = completion_params(request)
        result = str(params["result"])
        op = _Op("complete", request.job_key, request.input_version, request.fence, request, result)
        return cast(CompletionResult, (await self._submit((op,), writes=True))[0])

    async def claim(self, job_key: str, input_version: str, fence: int) -> ClaimResult:
        """Raise the job key's claimed fence to ``fence``; see ``CompletionStore.claim``.

        Retrying after a dead connection is safe: a claim that landed twice
        is one claim (``greatest``), and the answer reads what stands.
        """
        check_call(job_key, fence, input_version)
        op = _Op("claim", job_key, input_version, fence)
        return cast(ClaimResult, (await self._submit((op,), writes=True))[0])

    async def lookup(self, job_key: str, input_version: str) -> Completion | None:
        """Return this identity's completion, or ``None``."""
        return (await self.lookup_many([(job_key, input_version)]))[0]

    async def lookup_many(self, identities: Sequence[tuple[str, str]]) -> list[Completion | None]:
        """Return each identity's completion, or ``None``: one call of the next batch."""
        for job_key, input_version in identities:
            check_call(job_key, 0, input_version)
        if not identities:
            return []
        ops = tuple(_Op("lookup", key, version) for key, version in identities)
        return cast(list[Completion | None], await self._submit(ops, writes=False))

    async def state(self, job_key: str) -> Completion | None:
        """Return the job key's winning completion, or ``None``."""
        check_call(job_key, 0)

        async def read(conn: Conn, attempt: Attempt) -> Completion | None:
            row = await (await conn.execute(_STATE, (job_key,))).fetchone()
            return None if row is None else completion_of(job_key, row)

        return await self._pool.run(job_key, read)

    def transaction(
        self,
        job_key: str,
        input_version: str,
        fence: int,
        *,
        budget: Callable[[], float] | None = None,
    ) -> AbstractAsyncContextManager[StoreTransaction]:
        """Begin a job's transaction; see ``EffectStore.transaction`` and ``_pg_effects``."""
        return _pg_effects.transaction(self._pool, job_key, input_version, fence, budget)

    async def claim_outbox(self, relay: str, *, limit: int, hold: float) -> list[OutboxRow]:
        """Claim unsent messages; see ``EffectStore.claim_outbox`` and ``_pg_claims``."""
        return await self._claims.claim(relay, limit, hold)

    async def mark_sent(self, relay: str, ids: Sequence[int]) -> int:
        """Mark claimed messages sent; see ``EffectStore.mark_sent``."""
        return await self._claims.update(MARK, relay, ids)

    async def release_outbox(self, relay: str, ids: Sequence[int]) -> None:
        """Give up claims; see ``EffectStore.release_outbox``."""
        await self._claims.update(RELEASE, relay, ids)

    async def outbox(self, job_key: str | None = None) -> list[tuple[OutboxRow, bool]]:
        """Every outbox row with whether it was sent; see ``EffectStore.outbox``."""
        return [(entry.row, entry.sent) for entry in await self.outbox_entries(job_key)]

    async def outbox_entries(self, job_key: str | None = None) -> list[OutboxEntry]:
        """Every outbox row with its state; see ``EffectStore.outbox_entries``."""
        return await _pg_effects.entries(self._pool, job_key)

    async def outbox_backlog(self, prefix: str = "") -> tuple[int, float | None]:
        """Unsent messages and the oldest one's age; see ``EffectStore.outbox_backlog``."""
        return await _pg_effects.backlog(self._pool, prefix)

    async def prune_outbox(self, older_than: float, *, limit: int = PRUNE_LIMIT) -> int:
        """Delete old sent messages; see ``EffectStore.prune_outbox`` (in the relay's share)."""
        async with self._claims.slot():
            return await _pg_effects.prune(self._pool, older_than, limit)

    async def aclose(self) -> None:
        """Close the pool once no batch runs (waiting up to ``call_timeout`` for connections)."""
        pool = self._pool
        await self._batcher.close(functools.partial(pool.pool.close, timeout=pool.timeout))

    def __repr__(self) -> str:
        return f"PostgresStore(url={self._pool.shown_url!r}, call_timeout={self._pool.timeout})"

    async def _submit(self, ops: tuple[_Op, ...], *, writes: bool) -> list[object]:
        """Queue ``ops`` as one call of the next batch and return their answers, in order."""
        call: Call[list[object]] = Call(ops, writes, time.monotonic() + self._pool.timeout)
        return await self._batcher.submit(call)

    async def _run_batch(self, batch: list[Call[object]]) -> None:
        """Answer every call of ``batch`` from one call of ``leaseworker_calls()``.

        Each call holds one or more ops (a lookup of many identities); one
        transaction: if it fails, every call gets :class:`StoreUnavailable`.
        """
        started = time.monotonic()
        live: list[Call[object]] = []
        for call in batch:
            if call.deadline <= started:
                call.fail(
                    StoreUnavailable(call.op[0].job_key, f"no answer within {self._pool.timeout}s")
                )
            else:
                live.append(call)
        if not live:
            return
        ops: list[_Op] = [op for call in live for op in call.op]
        params = _batch_params(ops)

        fences = _fences(ops)

        async def attempt_once(conn: Conn, attempt: Attempt) -> tuple[list[TupleRow], bool]:
            with ending_older_holders(self._pool, conn, fences):
                rows = await (await conn.execute(_CALLS, params, prepare=True)).fetchall()
            return rows, attempt.retry

        try:
            rows, retried = await self._pool.run(
                None, attempt_once, within=min(call.deadline for call in live) - started
            )
        except StoreUnavailable as exc:
            for call in live:
                error = StoreUnavailable(call.op[0].job_key, exc.detail)
                error.__cause__ = exc.__cause__  # the psycopg error, as raising "from" would
                call.fail(error)
            return
        found = {row[0]: row[1:] for row in rows}
        number = 1  # leaseworker_calls() numbers the ops of the whole batch from 1
        for call in live:
            answers = []
            for op in call.op:
                answers.append(op.answer(found.get(number), retried=retried))
                number += 1
            call.succeed(answers)


@dataclass(frozen=True, slots=True)
class _Op:
    """One lookup, claim or completion waiting in a batch: its arguments, and its answer."""

    kind: Literal["lookup", "claim", "complete"]
    job_key: str
    input_version: str
    fence: int = 0  # a claim's or a completion's
    request: CompletionRequest | None = None  # a completion's
    result: str = "null"  # a completion's result, as checked JSON text

    def answer(self, row: TupleRow | None, *, retried: bool) -> object:
        """Build this call's answer from its row of ``leaseworker_calls()`` (``None``: no row).

        ``retried``: an earlier try of the batch failed on a dead connection.
        """
        if self.kind == "lookup":
            return None if row is None else completion_of(self.job_key, row[2:])
        assert row is not None  # claims and completions return one row on every path
        status, seen, *standing = row
        completion = maybe_completion_of(self.job_key, tuple(standing))
        if self.kind == "claim":
            return ClaimResult(
                status=status,
                job_key=self.job_key,
                input_version=self.input_version,
                fence=self.fence,
                highest_fence=seen,
                completion=completion,
            )
        assert self.request is not None
        answer = answer_to(self.request, status, winning_fence=seen, completion=completion)
        if retried and _own_landed(answer, self.request.execution_id):
            return dataclasses.replace(answer, status="accepted")
        return answer


def _fences(ops: Sequence[_Op]) -> dict[str, int]:
    """Return the highest fence of each job key whose head row ``ops`` lock (not lookups)."""
    fences: dict[str, int] = {}
    for op in ops:
        if op.kind != "lookup" and op.fence > fences.get(op.job_key, -1):
            fences[op.job_key] = op.fence
    return fences


def _batch_params(ops: Sequence[_Op]) -> tuple[str]:
    """Return ``leaseworker_calls()``'s argument for ``ops``: a JSON array, one entry per call.

    Each entry is ``[kind, job key, input version, fence, execution id, pod,
    result, cpu seconds, peak memory]`` (a claim's and a lookup's end at the
    fence); a completion's result is its JSON text already, spliced in as is.
    """
    entries = []
    for op in ops:
        head = f'["{op.kind}",{_string(op.job_key)},{_string(op.input_version)},{op.fence}'
        request = op.request
        if request is None:
            entries.append(f"{head}]")
        else:
            execution = f"{_string(request.execution_id)},{_string(request.pod)}"
            cost = f"{_number(request.cpu_seconds)},{_number(request.peak_memory)}"
            entries.append(f"{head},{execution},{op.result},{cost}]")
    return (f"[{','.join(entries)}]",)


_string = json.encoder.encode_basestring_ascii
"""A JSON string literal of a str, as ``json.dumps`` writes it (the C encoder's, no list)."""


def _number(value: float | None) -> str:
    """Return a checked cost (finite, at least 0) as a JSON number, or ``null``."""
    return "null" if value is None else repr(value)


def _own_landed(answer: CompletionResult, execution_id: str) -> bool:
    """Whether ``answer`` (to a retry) shows the earlier, lost attempt of this call committed."""
    return (
        answer.status == "duplicate"
        and answer.completion is not None
        and answer.completion.execution_id == execution_id
        and answer.completion.fence == answer.fence
    )
