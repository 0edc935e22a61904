"""The ``CompletionStore`` protocol: what the worker needs from the destination."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from ._fencing import ClaimResult, Completion, CompletionRequest, CompletionResult


class CompletionStore(Protocol):
    """A fenced, durable record of completed jobs (PostgreSQL or SQLite).

    Open one with :func:`open_store`. Every method is bounded by the store's
    ``timeout`` and raises :class:`StoreUnavailable` (carrying the job key) when
    the database fails or does not answer in time. A pod uses the store
    through :meth:`settled_by_offsets` and awaits :meth:`durable` before each
    offset commit.
    """

    async def complete(self, request: CompletionRequest) -> CompletionResult:
        """Record ``request``'s completion and result in one transaction, if the fence allows.

        ``accepted`` when its fence is at least the highest fence the store has
        seen for its job key (accepted or claimed) and its identity had not
        completed; ``duplicate`` (with the earlier result) when
        ``(job_key, input_version)`` had completed already; ``stale`` when a
        higher fence completed or claimed the job key, whether or not that
        claimer ever completes. Only ``accepted`` writes anything.

        On :class:`StoreUnavailable` the transaction was rolled back, unless the
        connection broke while committing; then the outcome is unknown, and
        calling again with the same identity answers ``duplicate`` if it did commit.
        """
        ...

    async def claim(self, job_key: str, input_version: str, fence: int) -> ClaimResult:
        """Record ``fence`` as the job key's claimed fence and look the identity up, atomically.

        The worker calls it after acquiring the lease and before the job runs:
        from then on every completion of the job key with a lower fence is
        ``stale``, so a paused former holder that wakes up cannot win even
        before this execution completes. Claims only rise (a lower claim
        leaves a higher one as it is) and are durable like completions
        (SQLite answers ``claimed`` before its fsync: a crash of the host's
        system, the one way to lose it, ends every execution it concerns).
        The answer says whether the job may run (``claimed``), need not
        (``duplicate``: the identity completed, perhaps since the lookup) or
        must not (``stale``: a higher fence stands). On
        :class:`StoreUnavailable` nothing is known: the job must not run.
        """
        ...

    async def lookup(self, job_key: str, input_version: str) -> Completion | None:
        """Return the completion of this identity, or ``None`` if it never completed."""
        ...

    async def lookup_many(self, identities: Sequence[tuple[str, str]]) -> list[Completion | None]:
        """Return the completion of each ``(job key, input version)``, in order, in one call.

        The worker asks this once for a poll's triggers, before any of them
        acquires its lease: a redelivered trigger whose identity completed
        already is answered ``duplicate`` without running. One call and one
        deadline for all of them: it raises :class:`StoreUnavailable` (carrying
        the first job key) if any cannot be answered.
        """
        ...

    async def state(self, job_key: str) -> Completion | None:
        """Return the job key's winning completion (highest fence), or ``None``.

        For operators (``leaseworker inspect``): winning fence, input version,
        completed_at, execution id and pod.
        """
        ...

    def settled_by_offsets(self) -> CompletionStore:
        """Return the store as a pod's triggers use it: what makes their answers last is the offset.

        Its answers may come before they are on disk (SQLite: before the
        fsync), because the pod commits a trigger's offset only after
        :meth:`durable`: a crash before that loses the answer and the offset
        together, and the trigger runs again. The same store underneath
        (connections, bell); a store whose answers are durable when given
        returns itself.
        """
        ...

    async def durable(self) -> None:
        """Return once every answer the store gave so far is on disk (the pod's offset barrier).

        Returns at once where answers are durable when given (PostgreSQL,
        ``memory://``); raises :class:`StoreUnavailable` if the disk failed or was late.
        """
        ...

    async def aclose(self) -> None:
        """Release connections; further calls fail. Safe to call twice."""
        ...


Barrier = Callable[[], Awaitable[None]]
"""``store.durable``: returns once every answer the store gave so far is on disk."""
