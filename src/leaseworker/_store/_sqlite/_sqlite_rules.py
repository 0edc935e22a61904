"""The SQLite store's statements: the fencing rule as SQL, run inside a batch.

Each function takes the store's connection inside the batch's write
transaction (or, for reads, on its own) and returns the call's answer.
``_sqlite_effects`` runs ``_complete`` in a job's own transaction too.
See docs/design.md#the-sqlite-store.
"""

from __future__ import annotations

import json
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from .._fencing import (
    NO_FENCE,
    ClaimResult,
    Completion,
    CompletionRequest,
    CompletionResult,
    Head,
    Status,
    answer_to,
    claim_answer,
)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_HEAD = "SELECT fence, input_version, claimed_fence FROM leaseworker_jobs WHERE job_key = ?"
_FIND = """
    SELECT input_version, fence, result, execution_id, pod, completed_at, cpu_seconds, peak_memory
    FROM leaseworker_completions WHERE job_key = ? AND input_version = ?
"""
# Binds :job_key, :input_version, :fence, :result, :execution_id, :pod,
# :cpu_seconds, :peak_memory and :now. Inserts nothing when the identity
# completed already or a higher fence holds the job key, accepted or claimed
# (an equal one may complete a new identity); an insert moves the job key's
# head (trigger leaseworker_move_head).
_RECORD_IF_CURRENT = """
    INSERT INTO leaseworker_completions
        (job_key, input_version, fence, result, execution_id, pod, completed_at,
         cpu_seconds, peak_memory)
    SELECT :job_key, :input_version, :fence, :result, :execution_id, :pod, :now,
           :cpu_seconds, :peak_memory
    WHERE NOT EXISTS (
        SELECT 1 FROM leaseworker_jobs
        WHERE job_key = :job_key AND max(fence, claimed_fence) > :fence
    )
    ON CONFLICT (job_key, input_version) DO NOTHING
"""
# A claim-only head row holds fence -1 and input version '' (no completion).
# It returns the head as it stands after the claim: fence < max(head, old
# claim) exactly when fence < max(head, new claim), so that decides the claim;
# and whether the identity completed (then read: one statement when not).
_CLAIM = """
    INSERT INTO leaseworker_jobs (job_key, fence, input_version, updated_at, claimed_fence)
    VALUES (:job_key, -1, '', :now, :fence)
    ON CONFLICT (job_key) DO UPDATE SET
        claimed_fence = max(claimed_fence, excluded.claimed_fence)
    RETURNING fence, input_version, claimed_fence, EXISTS (
        SELECT 1 FROM leaseworker_completions
        WHERE job_key = :job_key AND input_version = :input_version
    )
"""
_STATE = """
    SELECT c.input_version, c.fence, c.result, c.execution_id, c.pod, c.completed_at,
           c.cpu_seconds, c.peak_memory
    FROM leaseworker_jobs j
    JOIN leaseworker_completions c
      ON c.job_key = j.job_key AND c.input_version = j.input_version
    WHERE j.job_key = ?
"""


def _complete(
    conn: sqlite3.Connection, request: CompletionRequest, params: dict[str, Any]
) -> CompletionResult:
    """Record the completion if the fence allows; run inside the batch's write transaction."""
    params["now"] = now = time.time_ns() // 1000
    if conn.execute(_RECORD_IF_CURRENT, params).rowcount == 1:  # the trigger moved the head
        return _accepted(request, params, now)
    return _not_recorded(conn, request)


def _accepted(request: CompletionRequest, params: dict[str, Any], now: int) -> CompletionResult:
    """Answer a completion recorded at ``now`` (µs since the epoch), result as the row holds it."""
    recorded = Completion(
        job_key=request.job_key,
        input_version=request.input_version,
        fence=request.fence,
        result=json.loads(params["result"]),
        execution_id=request.execution_id,
        pod=request.pod,
        completed_at=_EPOCH + timedelta(microseconds=now),
        cpu_seconds=params["cpu_seconds"],
        peak_memory=params["peak_memory"],
    )
    return answer_to(request, "accepted", winning_fence=request.fence, completion=recorded)


def _not_recorded(conn: sqlite3.Connection, request: CompletionRequest) -> CompletionResult:
    """Answer a completion that wrote nothing: its identity completed, or a higher fence stands."""
    head_fence, head_version, claimed = conn.execute(_HEAD, (request.job_key,)).fetchone()
    status: Status = "duplicate"
    winner = _find(conn, request.job_key, request.input_version)
    if winner is None:  # stale: the head's completion, none if only a claim stands
        status, winner = "stale", _find(conn, request.job_key, head_version)
    seen = max(head_fence, claimed)
    return answer_to(request, status, winning_fence=seen, completion=winner)


def _claim(conn: sqlite3.Connection, job_key: str, input_version: str, fence: int) -> ClaimResult:
    """Record the claim and read what stands; run inside the batch's write transaction."""
    params = {
        "job_key": job_key,
        "input_version": input_version,
        "fence": fence,
        "now": time.time_ns() // 1000,
    }
    head_fence, head_version, claimed, done = conn.execute(_CLAIM, params).fetchone()
    head = None if head_fence == NO_FENCE else Head(head_fence, head_version)
    standing = _find(conn, job_key, input_version) if done else None
    return claim_answer(
        job_key, input_version, fence, standing=standing, head=head, claimed=claimed
    )


def _refused(answer: ClaimResult) -> bool:
    """Whether a claim's answer must be on disk before it is given: all but ``claimed``.

    ``claimed`` only lets this pod's job start. Pods share a SQLite file
    only on one host, so the crash of that host's system, the one way to
    lose a commit that is not yet on disk, also ends every execution that
    could use the claim or be fenced out by it. ``duplicate`` and ``stale``
    end the trigger on what was read, which must last.
    """
    return answer.status != "claimed"


def _any_found(found: list[Completion | None]) -> bool:
    """Whether a lookup's answer must be on disk before it is given: it found a completion."""
    return any(completion is not None for completion in found)


def _find(conn: sqlite3.Connection, job_key: str, input_version: str) -> Completion | None:
    row = conn.execute(_FIND, (job_key, input_version)).fetchone()
    return None if row is None else _completion(job_key, row)


def _state(conn: sqlite3.Connection, job_key: str) -> Completion | None:
    row = conn.execute(_STATE, (job_key,)).fetchone()
    return None if row is None else _completion(job_key, row)


def _completion(job_key: str, row: tuple[Any, ...]) -> Completion:
    input_version, fence, result, execution_id, pod, completed_at, cpu, peak = row
    return Completion(
        job_key=job_key,
        input_version=input_version,
        fence=fence,
        result=json.loads(result),
        execution_id=execution_id,
        pod=pod,
        completed_at=_EPOCH + timedelta(microseconds=completed_at),
        cpu_seconds=cpu,
        peak_memory=peak,
    )
