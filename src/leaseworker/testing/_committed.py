"""What a :class:`~leaseworker.testing.JobEnvironment` run committed: statements and messages.

Read from the ``memory://`` store around one run: the statements of the
transactions it committed and the outbox rows they added. A refused or
failed run committed none.
"""

from __future__ import annotations

import dataclasses

from .._store import MemoryStore
from ._job_result import JobResult

Mark = tuple[int, int]
"""How many statements and outbox rows the store held before a run."""


def effects_mark(store: MemoryStore) -> Mark:
    """Return where ``store``'s committed statements and outbox rows stand now."""
    return len(store.statements), len(store.outbox_rows.rows())


def with_effects(result: JobResult, store: MemoryStore, mark: Mark) -> JobResult:
    """Return ``result`` with the statements and messages committed since ``mark``."""
    statements, rows = mark
    return dataclasses.replace(
        result,
        statements=tuple(store.statements[statements:]),
        messages=tuple(row for row, _ in store.outbox_rows.rows()[rows:]),
    )
