"""The ``CompletionStore`` protocol: what the worker needs from the destination."""

from __future__ import annotations

from typing import Protocol

from ._model import Completion, CompletionRequest, CompletionResult


class CompletionStore(Protocol):
    """A fenced, durable record of completed jobs (PostgreSQL or SQLite).

    Open one with :func:`open_store`. Every method is bounded by the store's
    ``timeout`` and raises :class:`StoreUnavailable` (carrying the job key) when
    the database fails or does not answer in time.
    """

    async def complete(self, request: CompletionRequest) -> CompletionResult:
        """Record ``request``'s completion and result in one transaction, if the fence allows.

        ``accepted`` when its fence is at least the highest fence accepted for
        its job key and its identity had not completed; ``duplicate`` (with the
        earlier result) when ``(job_key, input_version)`` had completed already;
        ``stale`` when a higher fence already completed the job key. Only
        ``accepted`` writes anything.

        On :class:`StoreUnavailable` the transaction was rolled back, unless the
        connection broke while committing; then the outcome is unknown, and
        calling again with the same identity answers ``duplicate`` if it did commit.
        """
        ...

    async def lookup(self, job_key: str, input_version: str) -> Completion | None:
        """Return the completion of this identity, or ``None`` if it never completed.

        The worker asks this before acquiring a lease: a redelivered trigger whose
        identity completed already is answered ``duplicate`` without running.
        """
        ...

    async def state(self, job_key: str) -> Completion | None:
        """Return the job key's winning completion (highest fence), or ``None``.

        For operators (``leaseworker inspect``): winning fence, input version,
        completed_at, execution id and pod.
        """
        ...

    async def aclose(self) -> None:
        """Release connections; further calls fail. Safe to call twice."""
        ...
