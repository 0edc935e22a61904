"""The values a job's effects travel in: outbox messages, effect ids, the store's transaction.

A job's own statements and its messages commit in the completion's
transaction (:class:`StoreTransaction`); each message becomes an outbox row
(:class:`OutboxRow`) that a relay sends to Kafka with the headers named here.
The effect id is stable across executions of one identity: job key, input
version and the message's sequence number in its execution.
See docs/effects.md.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from json.encoder import encode_basestring_ascii
from typing import Any, Protocol, runtime_checkable

from ._bell import OutboxBell
from ._fencing import (
    ClaimResult,
    CompletionRequest,
    CompletionResult,
    check_text,
    encode_result,
)
from ._protocol import CompletionStore

EFFECT_ID_HEADER = "leaseworker-effect-id"
JOB_KEY_HEADER = "leaseworker-job-key"
FENCE_HEADER = "leaseworker-fence"
TRACE_HEADERS = ("traceparent", "tracestate")
"""The W3C trace context headers a message takes over from its trigger."""
RESERVED_HEADERS = frozenset({EFFECT_ID_HEADER, JOB_KEY_HEADER, FENCE_HEADER, *TRACE_HEADERS})
"""Headers the relay sets on every message; a job's own headers may not use these names."""

PRUNE_LIMIT = 1000
"""Sent rows one ``prune_outbox`` call looks at (and deletes at most)."""

Params = Sequence[Any] | Mapping[str, Any] | None
"""A statement's parameters, as the database driver takes them."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """One message a job publishes, before it commits: topic, value, key, headers.

    Value, key and headers stay out of the repr: they may carry payload data.
    """

    topic: str
    value: bytes = field(repr=False)
    key: bytes | None = field(default=None, repr=False)
    headers: tuple[tuple[str, bytes], ...] = field(default=(), repr=False)
    trace: tuple[tuple[str, bytes], ...] = ()

    @classmethod
    def build(
        cls,
        topic: str,
        value: object,
        *,
        key: str | bytes | None = None,
        headers: Mapping[str, str | bytes] | Sequence[tuple[str, str | bytes]] | None = None,
    ) -> Message:
        """Check and encode ``publish()``'s arguments (``ValueError``/``TypeError``, before I/O).

        ``value``: bytes as they are, ``str`` as UTF-8, anything else as strict
        compact JSON. ``key``: ``str`` as UTF-8. Header names may not be the
        reserved ``leaseworker-*`` ones.
        """
        check_text("topic", topic)
        if isinstance(value, bytes | bytearray):
            encoded = bytes(value)
        elif isinstance(value, str):
            encoded = value.encode()
        else:
            encoded = encode_result(topic, value).encode()
        pairs = list(headers.items()) if isinstance(headers, Mapping) else list(headers or ())
        checked = []
        for name, raw in pairs:
            check_text("header name", name)
            if name in RESERVED_HEADERS:
                raise ValueError(f"header {name!r} is set by leaseworker")
            checked.append((name, raw.encode() if isinstance(raw, str) else bytes(raw)))
        return cls(
            topic=topic,
            value=encoded,
            key=key.encode() if isinstance(key, str) else key,
            headers=tuple(checked),
        )


def trace_of(headers: Sequence[tuple[str, bytes]]) -> tuple[tuple[str, bytes], ...]:
    """Return the W3C trace context among a trigger's ``headers``, for its messages to carry."""
    return tuple((name, value) for name, value in headers if name.lower() in TRACE_HEADERS)


def effect_id(job_key: str, input_version: str, seq: int) -> str:
    """Return the effect id of message ``seq`` of an identity: stable, short, a valid job key.

    ``lw1:`` + 32 hex digits of sha256 over the identity + ``:seq``: the same
    for every execution of the identity, so a receiver keyed by it drops what
    it has seen whichever execution committed it.
    """
    # json.dumps([job_key, input_version]) spelt out: the same text, a tenth of the time
    identity = f"[{encode_basestring_ascii(job_key)}, {encode_basestring_ascii(input_version)}]"
    digest = hashlib.sha256(identity.encode()).hexdigest()
    return f"lw1:{digest[:32]}:{seq}"


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxRow:
    """One committed message as the relay claims it: its row id and where it came from.

    ``id`` orders the rows of one job key in commit order (the head row's
    lock serialises their transactions). ``stored_effect_id`` is the effect
    id the SQL stores wrote at commit (``None`` for a row committed by code
    before schema 11, and in ``memory://``): the relay reads it instead of
    hashing the identity again for every row it sends.
    """

    id: int
    job_key: str
    input_version: str
    seq: int
    fence: int
    message: Message
    stored_effect_id: str | None = field(default=None, repr=False, compare=False)

    @property
    def effect_id(self) -> str:
        """The message's effect id (see :func:`effect_id`)."""
        stored = self.stored_effect_id
        if stored is not None:
            return stored
        return effect_id(self.job_key, self.input_version, self.seq)

    def kafka_headers(self) -> list[tuple[str, bytes]]:
        """Return the headers to send: the job's, the trace context, and leaseworker's three."""
        return [
            *self.message.headers,
            *self.message.trace,
            (EFFECT_ID_HEADER, self.effect_id.encode()),
            (JOB_KEY_HEADER, self.job_key.encode()),
            (FENCE_HEADER, str(self.fence).encode()),
        ]


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxEntry:
    """One outbox row and its state: when it committed, when it was sent, how often claimed.

    ``attempts`` counts the relays' claims of it (1 when the first send went
    through; a released claim counts too, an expired one too except on
    PostgreSQL, where a claim counts when its relay marks or releases it).
    ``sent_by`` names the relay that sent it (a pod's is ``<pod>:<8 hex
    digits>``), ``None`` while unsent. Times in UTC.
    """

    row: OutboxRow
    committed_at: datetime
    sent_at: datetime | None
    attempts: int
    sent_by: str | None = None

    @property
    def sent(self) -> bool:
        """Whether the broker acknowledged it (the relay marked it sent)."""
        return self.sent_at is not None


def pick_claims(
    unsent: Iterable[tuple[int, str, str | None, float]], relay: str, *, now: float, limit: int
) -> list[int]:
    """Return the ids ``relay`` may claim of ``unsent`` ``(id, job key, claimed by, until)``.

    ``unsent`` in id (commit) order. A row another relay holds (its claim not
    expired) blocks its job key's later rows, so one key's messages are never
    sent by two relays at once, nor out of order. The stores that cannot say
    this in SQL (SQLite, ``memory://``) apply it here.
    """
    blocked: set[str] = set()
    taken: list[int] = []
    for row_id, job_key, claimed_by, until in unsent:
        if len(taken) >= limit:
            break
        if job_key in blocked:
            continue
        if claimed_by not in (None, relay) and until > now:
            blocked.add(job_key)
            continue
        taken.append(row_id)
    return taken


def encode_headers(headers: Sequence[tuple[str, bytes]]) -> str:
    """Return headers as the JSON text an outbox row keeps (values base64)."""
    return json.dumps([[name, base64.b64encode(value).decode()] for name, value in headers])


def decode_headers(text: str) -> tuple[tuple[str, bytes], ...]:
    """Inverse of :func:`encode_headers` (no headers, the common case, without JSON)."""
    if text == "[]":
        return ()
    # binascii's decoder is what base64.b64decode calls, without its argument checks
    return tuple((name, binascii.a2b_base64(value)) for name, value in json.loads(text))


def outbox_params(request: CompletionRequest, messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Return one named-parameter row per message of ``request``'s execution, in order."""
    return [
        {
            "job_key": request.job_key,
            "input_version": request.input_version,
            "seq": seq,
            "fence": request.fence,
            "topic": message.topic,
            "msg_key": message.key,
            "value": message.value,
            "headers": encode_headers(message.headers),
            "trace": encode_headers(message.trace),
            "effect_id": effect_id(request.job_key, request.input_version, seq),
        }
        for seq, message in enumerate(messages)
    ]


def outbox_row(row: Sequence[Any]) -> OutboxRow:
    """Build an :class:`OutboxRow` from an outbox table's columns (both SQL stores).

    The two frozen objects are filled slot by slot, as their ``__init__``
    would, without its keyword parsing: a claim builds 1,000 at a time, and
    the constructors took 2.6 of the 2.9 µs a row (bench/README.md, relay).
    Every field is set; a test compares the result with the constructors'.
    """
    row_id, job_key, version, seq, fence, topic, key, value, headers, trace, effect = row
    message = _new(Message)
    _set(message, "topic", topic)
    _set(message, "value", bytes(value))
    _set(message, "key", None if key is None else bytes(key))
    _set(message, "headers", decode_headers(headers))
    _set(message, "trace", decode_headers(trace))
    built = _new(OutboxRow)
    _set(built, "id", row_id)
    _set(built, "job_key", job_key)
    _set(built, "input_version", version)
    _set(built, "seq", seq)
    _set(built, "fence", fence)
    _set(built, "message", message)
    _set(built, "stored_effect_id", effect)
    return built


_new = object.__new__
_set = object.__setattr__
"""What a frozen dataclass's ``__init__`` calls (``outbox_row``)."""


class StoreTransaction(Protocol):
    """One open transaction in the completion store's database, holding a job key's head lock.

    ``opened`` is what stood under the lock when it began: only ``claimed``
    lets the job write. ``commit`` records the completion and the messages in
    this transaction and commits it; leaving the ``transaction()`` block
    without committing rolls everything back. ``hold_limit``: the seconds a
    block may last, on a store whose transaction stalls its other calls
    (SQLite); ``None`` elsewhere.
    """

    opened: ClaimResult
    statements: list[tuple[str, Params]]
    hold_limit: float | None

    @property
    def connection(self) -> Any:
        """The database driver's connection (psycopg's on PostgreSQL), inside the transaction."""
        ...

    async def execute(self, sql: str, params: Params = None) -> list[tuple[Any, ...]]:
        """Run one of the job's statements in the transaction; return its rows (if any)."""
        ...

    async def commit(
        self, request: CompletionRequest, messages: Sequence[Message]
    ) -> CompletionResult:
        """Record ``request``'s completion and ``messages`` in the transaction; commit."""
        ...


@runtime_checkable
class EffectStore(CompletionStore, Protocol):
    """A completion store that runs jobs' transactions and keeps their outbox."""

    @property
    def outbox_bell(self) -> OutboxBell:
        """Rung after this process committed messages; the store's relay waits on it."""
        ...

    def transaction(
        self,
        job_key: str,
        input_version: str,
        fence: int,
        *,
        budget: Callable[[], float] | None = None,
    ) -> AbstractAsyncContextManager[StoreTransaction]:
        """Begin a transaction holding ``job_key``'s head lock; see :class:`StoreTransaction`.

        ``budget()``: the seconds the transaction may still live (the lease's
        remaining validity, read before each statement); the database ends it
        when they run out between statements, where it can (``None``: the
        store's own timeout). A statement is ended by the store when the
        calling task is cancelled.
        """
        ...

    async def claim_outbox(self, relay: str, *, limit: int, hold: float) -> list[OutboxRow]:
        """Claim up to ``limit`` unsent messages for ``hold`` seconds, oldest first, key order kept.

        A message is claimed only with every earlier unsent message of its job
        key, so no two relays ever send one key's messages out of order. A
        claim that expired (its relay died) may be taken over.
        """
        ...

    async def mark_sent(self, relay: str, ids: Sequence[int]) -> int:
        """Mark the messages ``ids`` this relay claimed as sent; return how many were."""
        ...

    async def release_outbox(self, relay: str, ids: Sequence[int]) -> None:
        """Give up this relay's claims on ``ids`` so another relay may take them at once."""
        ...

    async def outbox(self, job_key: str | None = None) -> list[tuple[OutboxRow, bool]]:
        """Every outbox row (of ``job_key``), in order, with whether it was sent."""
        ...

    async def outbox_entries(self, job_key: str | None = None) -> list[OutboxEntry]:
        """Every outbox row (of ``job_key``), in order, with its state (``inspect``)."""
        ...

    async def outbox_backlog(self, prefix: str = "") -> tuple[int, float | None]:
        """Return how many messages are unsent and the oldest one's age in seconds (``None``).

        Only the messages whose job key starts with ``prefix`` count (one
        namespace's: ``ns:{``); ``""``: every message in the store.
        """
        ...

    async def prune_outbox(self, older_than: float, *, limit: int = PRUNE_LIMIT) -> int:
        """Delete up to ``limit`` rows sent more than ``older_than`` seconds ago; return how many.

        Never an unsent row. Looks at the ``limit`` oldest sent rows only (a
        bounded scan): rows leave roughly in commit order, so those are the
        old ones; a later call takes the next. PostgreSQL deletes a relay's
        round of sent rows whole: the oldest one even if it alone is bigger.
        """
        ...


def effect_store(store: CompletionStore) -> EffectStore:
    """Return ``store`` as an :class:`EffectStore`, or raise ``TypeError`` if it runs no effects."""
    if not isinstance(store, EffectStore):
        raise TypeError(
            f"{type(store).__name__} runs no transactions: ctx.transaction() and ctx.publish() "
            "need the PostgreSQL, SQLite or memory:// store"
        )
    return store
