"""``memory://``: the completion store in this process's memory, for tests and demos.

It applies the same fencing and identity rule as the durable backends, by
calling :func:`~leaseworker._store._model.decide` directly, and answers the
same way (results come back as fresh JSON-decoded copies). It is not durable
and not shared: a pod restart forgets every completion, and two pods never
see each other's, so a redelivered trigger may run again. What it is for:
tests of jobs, the embedded demo, and measuring leaseworker's own cost per
trigger without a database's.

Every call finishes without awaiting anything, so each one is atomic on the
event loop that makes it; a store belongs to one event loop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import final

from .._errors import StoreUnavailable
from ._model import (
    Completion,
    CompletionRequest,
    CompletionResult,
    Head,
    answer_to,
    check_call,
    completion_params,
    decide,
)


@dataclass(frozen=True, slots=True)
class _Row:
    """One recorded completion, its result kept as the JSON text a database would hold."""

    fence: int
    result: str
    execution_id: str
    pod: str
    completed_at: datetime

    def completion(self, job_key: str, input_version: str) -> Completion:
        return Completion(
            job_key=job_key,
            input_version=input_version,
            fence=self.fence,
            result=json.loads(self.result),
            execution_id=self.execution_id,
            pod=self.pod,
            completed_at=self.completed_at,
        )


@final
class MemoryStore:
    """A :class:`~leaseworker.CompletionStore` held in a dict; see the module docstring."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str], _Row] = {}
        self._heads: dict[str, Head] = {}
        self._closed = False

    async def complete(self, request: CompletionRequest) -> CompletionResult:
        """Record a completion if the fence allows; see ``CompletionStore.complete``."""
        params = completion_params(request)
        key, version = request.job_key, request.input_version
        self._check_open(key)
        existing = self._rows.get((key, version))
        head = self._heads.get(key)
        standing = None if existing is None else existing.completion(key, version)
        status = decide(standing, head, request.fence)
        if status == "accepted":
            row = _Row(
                request.fence,
                str(params["result"]),
                request.execution_id,
                request.pod,
                datetime.now(UTC),
            )
            self._rows[(key, version)] = row
            head = self._heads[key] = Head(fence=request.fence, input_version=version)
            winner = row.completion(key, version)
        else:
            assert head is not None  # a duplicate or stale answer implies an accepted one
            winner = standing or self._rows[(key, head.input_version)].completion(
                key, head.input_version
            )  # duplicate: this identity's completion; stale: the one that won
        return answer_to(request, status, winning_fence=head.fence, completion=winner)

    async def lookup(self, job_key: str, input_version: str) -> Completion | None:
        """Return this identity's completion, or ``None``."""
        check_call(job_key, 0, input_version)
        self._check_open(job_key)
        row = self._rows.get((job_key, input_version))
        return None if row is None else row.completion(job_key, input_version)

    async def state(self, job_key: str) -> Completion | None:
        """Return the job key's winning completion, or ``None``."""
        check_call(job_key, 0)
        self._check_open(job_key)
        head = self._heads.get(job_key)
        if head is None:
            return None
        return self._rows[(job_key, head.input_version)].completion(job_key, head.input_version)

    async def aclose(self) -> None:
        """Forget everything; further calls raise :class:`StoreUnavailable`."""
        self._closed = True
        self._rows.clear()
        self._heads.clear()

    def _check_open(self, job_key: str) -> None:
        if self._closed:
            raise StoreUnavailable(job_key, "the store is closed")

    def __repr__(self) -> str:
        return f"MemoryStore(completions={len(self._rows)})"
