"""The fenced, durable completion store (the destination side of fencing).

One protocol, one subpackage per backend, shared helpers beside them. The
backends import the helpers; of those only ``_open`` and ``_migrate`` import
a backend (picked by URL); no backend imports another.

- ``_protocol``: the ``CompletionStore`` protocol (with ``durable()``, the
  pod's offset barrier, and ``settled_by_offsets()``, the view a pod's
  triggers use); ``_effect_rows``: the values a job's effects travel in and the
  ``EffectStore`` protocol (transactions, the outbox, its ``outbox_bell``);
- ``_fencing``: the values and the fencing rule; ``_url``: URL parsing and
  redaction; ``_guard``: the fence-guard SQL helper for effects written
  outside the store; ``_group_commit``: the group commit both durable stores use;
  ``_bell``: the outbox bell that wakes a store's relay;
- ``_migration``, ``_schema`` and ``_outbox_schema``: the versioned
  migrations and their order; ``_migrate``: ``store migrate`` and ``store check`` by URL;
- ``_open``: ``open_store(url)``, the URL-selected factory;
- the backends: ``_postgres`` (psycopg; imported only when a
  ``postgresql://`` URL is opened or migrated), ``_sqlite`` (the default)
  and ``_memory`` (``memory://``), each a subpackage whose face names its store.
"""

from ._bell import OutboxBell as OutboxBell
from ._effect_rows import EFFECT_ID_HEADER as EFFECT_ID_HEADER
from ._effect_rows import FENCE_HEADER as FENCE_HEADER
from ._effect_rows import JOB_KEY_HEADER as JOB_KEY_HEADER
from ._effect_rows import PRUNE_LIMIT as PRUNE_LIMIT
from ._effect_rows import EffectStore as EffectStore
from ._effect_rows import Message as Message
from ._effect_rows import OutboxEntry as OutboxEntry
from ._effect_rows import OutboxRow as OutboxRow
from ._effect_rows import Params as Params
from ._effect_rows import StoreTransaction as StoreTransaction
from ._effect_rows import decode_headers as decode_headers
from ._effect_rows import effect_id as effect_id
from ._effect_rows import effect_store as effect_store
from ._effect_rows import encode_headers as encode_headers
from ._effect_rows import outbox_row as outbox_row
from ._effect_rows import trace_of as trace_of
from ._fencing import MAX_FENCE as MAX_FENCE
from ._fencing import NO_FENCE as NO_FENCE
from ._fencing import ClaimResult as ClaimResult
from ._fencing import Completion as Completion
from ._fencing import CompletionRequest as CompletionRequest
from ._fencing import CompletionResult as CompletionResult
from ._fencing import Head as Head
from ._fencing import Status as Status
from ._fencing import answer_to as answer_to
from ._fencing import check_text as check_text
from ._fencing import decide as decide
from ._fencing import decide_claim as decide_claim
from ._group_commit import Batcher as Batcher
from ._group_commit import Call as Call
from ._guard import fenced_upsert as fenced_upsert
from ._memory import MemoryStore as MemoryStore
from ._migrate import check_store as check_store
from ._migrate import migrate_store as migrate_store
from ._migration import Migration as Migration
from ._open import STORE_CONNECTIONS as STORE_CONNECTIONS
from ._open import open_store as open_store
from ._protocol import Barrier as Barrier
from ._protocol import CompletionStore as CompletionStore
from ._schema import MIGRATIONS as MIGRATIONS
from ._schema import pending as pending
from ._sqlite import SqliteStore as SqliteStore
from ._sqlite import WalSync as WalSync
from ._url import DEFAULT_URL as DEFAULT_URL
from ._url import StoreURL as StoreURL
from ._url import parse_store_url as parse_store_url
from ._url import redact as redact

__all__ = [
    "DEFAULT_URL",
    "EFFECT_ID_HEADER",
    "FENCE_HEADER",
    "JOB_KEY_HEADER",
    "MAX_FENCE",
    "MIGRATIONS",
    "NO_FENCE",
    "PRUNE_LIMIT",
    "STORE_CONNECTIONS",
    "Barrier",
    "Batcher",
    "Call",
    "ClaimResult",
    "Completion",
    "CompletionRequest",
    "CompletionResult",
    "CompletionStore",
    "EffectStore",
    "Head",
    "MemoryStore",
    "Message",
    "Migration",
    "OutboxBell",
    "OutboxEntry",
    "OutboxRow",
    "Params",
    "SqliteStore",
    "Status",
    "StoreTransaction",
    "StoreURL",
    "WalSync",
    "answer_to",
    "check_store",
    "check_text",
    "decide",
    "decide_claim",
    "decode_headers",
    "effect_id",
    "effect_store",
    "encode_headers",
    "fenced_upsert",
    "migrate_store",
    "open_store",
    "outbox_row",
    "parse_store_url",
    "pending",
    "redact",
    "trace_of",
]
