"""The PostgreSQL completion store (psycopg 3): ``open_store("postgresql://...")`` opens it.

Importing this package imports psycopg: :func:`~leaseworker._store.open_store`
and :func:`~leaseworker._store.migrate_store` do so only for a
``postgresql://`` URL. Its modules, each named after the backend:

- ``_pg_store``: :class:`PostgresStore`, the ``CompletionStore``; lookups,
  claims and completions batched into one ``leaseworker_calls()`` each trip;
- ``_pg_pool``: :class:`PgPool`, what every part goes through (the pool,
  one deadline per call, psycopg's errors as ``StoreUnavailable``);
- ``_pg_effects``: the jobs' transactions and the outbox's reads and prune;
- ``_pg_claims``: the relays' claims of the outbox queue (row locks);
- ``_pg_takeover``: a newer fence waiting for a key's head row ends the
  session of the older execution holding it (marked by its transaction);
- ``_pg_schema``: the first connection and the schema's migrations at open,
  and what ``store check`` reports; ``_pg_standby``: whether commits wait for
  the server's standbys (a warning at open when they do not);
- ``_pg_grants``: the runtime role's privileges (checked at open, granted by
  ``store migrate``); ``_pg_refusal``: a refused connection told from a
  server that is not up.
"""

from ._pg_grants import grant_runtime_at as grant_runtime_at
from ._pg_refusal import refusal as refusal
from ._pg_schema import check_at as check_at
from ._pg_store import PostgresStore as PostgresStore

__all__ = ["PostgresStore", "check_at", "grant_runtime_at", "refusal"]
