"""The embedded completion store (the standard library's ``sqlite3``): ``sqlite:///path``.

Its modules, each named after the backend:

- ``_sqlite_store``: :class:`SqliteStore`, the ``CompletionStore``, and the
  view a pod's triggers use (answers at the commit, the offsets wait for
  :meth:`SqliteStore.durable`);
- ``_sqlite_connection``: :class:`SqliteConnection`, the one connection
  every part goes through (batches, one deadline per call, the fsync waits);
- ``_sqlite_rules``: the fencing rule as SQL, one call at a time;
  ``_sqlite_many``: claims, completions and look-ups of many keys at once;
- ``_sqlite_effects``: the jobs' transactions and the outbox;
- ``_sqlite_sync``: the file, its migrations, its fsyncs and checkpoints.
"""

from ._sqlite_store import SqliteStore as SqliteStore
from ._sqlite_sync import WalSync as WalSync

__all__ = ["SqliteStore", "WalSync"]
