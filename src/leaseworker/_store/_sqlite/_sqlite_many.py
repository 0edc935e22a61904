"""The SQLite store's claims, completions and look-ups of many job keys in one statement each.

A loop pass's writes commit in one transaction (``_sqlite_connection``); this module
runs their claims, and their completions, as one multi-row statement of each
kind instead of one statement per call: the statement's setup, binding and
the SQLite call are paid once (measured, keys of neighbouring pages: a claim
10 µs instead of 18, a completion 9 instead of 15, commits included; keys
scattered over a big table gain less, the b-tree's page work dominating).
Only calls of job keys that no
other write of the transaction touches are grouped, so the order of the
groups cannot change an answer; the rest run one by one, in the order asked.
The fencing rule is the one of :mod:`._sqlite_rules`, row by row.
See docs/design.md#the-sqlite-store.
"""

from __future__ import annotations

import functools
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, final

from .._fencing import (
    NO_FENCE,
    ClaimResult,
    Completion,
    CompletionRequest,
    CompletionResult,
    Head,
    claim_answer,
)
from ._sqlite_rules import _accepted, _claim, _complete, _completion, _not_recorded

CHUNK = 16
"""Rows per multi-row statement: bigger groups run as several (few distinct statements to cache)."""


@final
@dataclass(frozen=True, slots=True)
class Claim:
    """A claim waiting for its transaction: ``Claim(...)(conn)`` runs it alone."""

    job_key: str
    input_version: str
    fence: int

    def __call__(self, conn: sqlite3.Connection) -> ClaimResult:
        return _claim(conn, self.job_key, self.input_version, self.fence)


@final
@dataclass(frozen=True, slots=True)
class Record:
    """A completion waiting for its transaction: ``Record(...)(conn)`` runs it alone."""

    request: CompletionRequest
    params: dict[str, Any]

    @property
    def job_key(self) -> str:
        return self.request.job_key

    def __call__(self, conn: sqlite3.Connection) -> CompletionResult:
        return _complete(conn, self.request, self.params)


Op = Callable[[sqlite3.Connection], Any]
"""A store call waiting for its transaction: a function of the connection."""


def run_all(conn: sqlite3.Connection, ops: Sequence[Op]) -> list[Any]:
    """Run ``ops`` in the caller's transaction and return their outcomes, in order.

    Claims and completions of job keys touched once among ``ops`` run in
    multi-row statements (each reads and writes its own key's rows only, so
    they commute with every other op); everything else runs alone, in order.
    """
    keys = Counter(op.job_key for op in ops if isinstance(op, Claim | Record))
    claims = [
        (i, op) for i, op in enumerate(ops) if isinstance(op, Claim) and keys[op.job_key] == 1
    ]
    records = [
        (i, op) for i, op in enumerate(ops) if isinstance(op, Record) and keys[op.job_key] == 1
    ]
    outcomes: dict[int, object] = {}
    if len(claims) > 1:
        answers = claim_many(conn, [claim for _, claim in claims])
        outcomes.update(zip([i for i, _ in claims], answers, strict=True))
    if len(records) > 1:
        results = record_many(conn, [record for _, record in records])
        outcomes.update(zip([i for i, _ in records], results, strict=True))
    for i, op in enumerate(ops):
        if i not in outcomes:
            outcomes[i] = op(conn)
    return [outcomes[i] for i in range(len(ops))]


def claim_many(conn: sqlite3.Connection, claims: Sequence[Claim]) -> list[ClaimResult]:
    """Record claims of distinct job keys and answer each; see ``_sqlite_rules._claim``."""
    answers: list[ClaimResult] = []
    now = time.time_ns() // 1000
    for start in range(0, len(claims), CHUNK):
        part = claims[start : start + CHUNK]
        params: list[object] = []
        for claim in part:
            params += (claim.job_key, now, claim.fence)
        heads = {row[0]: row[1:] for row in conn.execute(_claims_sql(len(part)), params)}
        standing = find_many(conn, [(claim.job_key, claim.input_version) for claim in part])
        for claim, completion in zip(part, standing, strict=True):
            head_fence, head_version, claimed = heads[claim.job_key]
            answers.append(
                claim_answer(
                    claim.job_key,
                    claim.input_version,
                    claim.fence,
                    standing=completion,
                    head=None if head_fence == NO_FENCE else Head(head_fence, head_version),
                    claimed=claimed,
                )
            )
    return answers


def record_many(conn: sqlite3.Connection, records: Sequence[Record]) -> list[CompletionResult]:
    """Record completions of distinct job keys where the fence allows; see ``_complete``."""
    results: list[CompletionResult] = []
    now = time.time_ns() // 1000
    for start in range(0, len(records), CHUNK):
        part = records[start : start + CHUNK]
        params: list[object] = []
        for record in part:
            p = record.params
            params += (p["job_key"], p["input_version"], p["fence"], p["result"])
            params += (p["execution_id"], p["pod"], now, p["cpu_seconds"], p["peak_memory"])
        accepted = {key for (key,) in conn.execute(_records_sql(len(part)), params)}
        for record in part:
            request = record.request
            if request.job_key not in accepted:
                results.append(_not_recorded(conn, request))
            else:
                results.append(_accepted(request, record.params, now))
    return results


def find_many(
    conn: sqlite3.Connection, identities: Sequence[tuple[str, str]]
) -> list[Completion | None]:
    """Return each identity's completion, or ``None``: one statement per :data:`CHUNK`."""
    found: dict[tuple[str, str], Completion] = {}
    for start in range(0, len(identities), CHUNK):
        part = identities[start : start + CHUNK]
        params = [text for identity in part for text in identity]
        for row in conn.execute(_finds_sql(len(part)), params):
            found[row[0], row[1]] = _completion(row[0], row[1:])
    return [found.get(identity) for identity in identities]


# The statements, built once per row count. A claim-only head row holds fence
# -1 and input version '' (no completion); RETURNING gives the head as it
# stands after the claim, as _sqlite_rules._CLAIM does (its rows come in no
# set order: keyed by job key). A completion inserts nothing when a higher
# fence holds its key, accepted or claimed, or its identity completed; its
# insert moves the key's head (trigger leaseworker_move_head).
_CLAIM_ROW = "(?, -1, '', ?, ?)"


@functools.cache
def _claims_sql(rows: int) -> str:
    return (
        "INSERT INTO leaseworker_jobs (job_key, fence, input_version, updated_at, claimed_fence)"
        f" VALUES {_places(rows, _CLAIM_ROW)}"
        " ON CONFLICT (job_key) DO UPDATE SET"
        " claimed_fence = max(claimed_fence, excluded.claimed_fence)"
        " RETURNING job_key, fence, input_version, claimed_fence"
    )


@functools.cache
def _records_sql(rows: int) -> str:
    return (
        "INSERT INTO leaseworker_completions"
        " (job_key, input_version, fence, result, execution_id, pod, completed_at,"
        " cpu_seconds, peak_memory)"
        " SELECT v.column1, v.column2, v.column3, v.column4, v.column5, v.column6, v.column7,"
        " v.column8, v.column9"
        f" FROM (VALUES {_places(rows, '(?, ?, ?, ?, ?, ?, ?, ?, ?)')}) AS v"
        " WHERE NOT EXISTS (SELECT 1 FROM leaseworker_jobs"
        " WHERE job_key = v.column1 AND max(fence, claimed_fence) > v.column3)"
        " ON CONFLICT (job_key, input_version) DO NOTHING"
        " RETURNING job_key"
    )


# A join from the identities (not ``IN (VALUES ...)``, which SQLite answers
# with a scan of the table): one primary-key search per identity.
@functools.cache
def _finds_sql(rows: int) -> str:
    return (
        f"WITH w (k, v) AS (VALUES {_places(rows, '(?, ?)')})"
        " SELECT c.job_key, c.input_version, c.fence, c.result, c.execution_id, c.pod,"
        " c.completed_at, c.cpu_seconds, c.peak_memory FROM w JOIN leaseworker_completions AS c"
        " ON c.job_key = w.k AND c.input_version = w.v"
    )


def _places(rows: int, row: str) -> str:
    return ", ".join([row] * rows)
