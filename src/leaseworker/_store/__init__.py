"""The fenced, durable completion store (the destination side of fencing).

``_model`` holds the values and the fencing rule, ``_protocol`` the
``CompletionStore`` protocol, ``_url`` URL parsing and redaction, ``_schema``
the versioned migrations, ``_postgres`` and ``_sqlite`` the two adapters
(``_sqlite_rules`` its statements, ``_sqlite_sync`` its file and fsyncs),
``_batch`` the group commit both durable stores use, ``_memory`` the in-process store,
``_open`` the URL-selected factory, ``_guard`` the fence-guard SQL helper for
effects written outside the store. ``_effects`` the jobs' transactions and
outbox rows (``EffectStore``), ``_pg_effects`` (with ``_pg_claims``, its relays'
claims), ``_sqlite_effects`` and ``_memory_effects`` each backend's transaction,
outbox and relay claims.
``_postgres`` (psycopg) is imported only when a ``postgresql://`` URL is opened.
"""

from ._effects import EffectStore as EffectStore
from ._effects import effect_id as effect_id
from ._effects import effect_store as effect_store
from ._guard import fenced_upsert as fenced_upsert
from ._model import ClaimResult as ClaimResult
from ._model import Completion as Completion
from ._model import CompletionRequest as CompletionRequest
from ._model import CompletionResult as CompletionResult
from ._model import Status as Status
from ._model import check_text as check_text
from ._open import open_store as open_store
from ._protocol import SETTLED_BY_OFFSETS as SETTLED_BY_OFFSETS
from ._protocol import Barrier as Barrier
from ._protocol import CompletionStore as CompletionStore
from ._protocol import barrier_of as barrier_of
from ._url import DEFAULT_URL as DEFAULT_URL
from ._url import StoreURL as StoreURL
from ._url import parse_store_url as parse_store_url
from ._url import redact as redact

__all__ = [
    "DEFAULT_URL",
    "SETTLED_BY_OFFSETS",
    "Barrier",
    "ClaimResult",
    "Completion",
    "CompletionRequest",
    "CompletionResult",
    "CompletionStore",
    "EffectStore",
    "Status",
    "StoreURL",
    "barrier_of",
    "check_text",
    "effect_id",
    "effect_store",
    "fenced_upsert",
    "open_store",
    "parse_store_url",
    "redact",
]
