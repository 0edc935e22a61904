"""The executor claims the job key with its fence after the acquire and before ``run``.

One ``Executor`` against the session's real Redis and a ``memory://`` store
behind a steerable wrapper: the claim can fail (store down), find a higher
fence, or find the identity completed since the first lookup. In each case
the job must not run, and the ending says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from leaseworker import (
    Backoff,
    ClaimResult,
    Completion,
    CompletionRequest,
    CompletionResult,
    Event,
    ExecutionEvent,
    JobContext,
    RedisLeases,
    ReportJob,
    StoreUnavailable,
)
from leaseworker._execution import Executor, Trigger, completion_key
from leaseworker._store import MemoryStore

KEY = "report:acme:2026-11"


class CountingJob(ReportJob):
    """Counts its runs and checks, as it starts, that the store has seen its fence."""

    topic = "unused"
    lease_duration = 4.0

    def __init__(self, store: MemoryStore, namespace: str) -> None:
        self.store = store
        self.namespace = namespace
        self.runs: list[int] = []
        self.fenced_at_start: list[str] = []

    async def run(self, ctx: JobContext) -> object:
        """Record the run and what a lower fence would be answered now."""
        self.runs.append(ctx.fence)
        late = await self.store.complete(
            CompletionRequest(
                job_key=completion_key(self.namespace, ctx.job_key),
                input_version="someone-older",
                fence=ctx.fence - 1,
                result=None,
                execution_id="older",
                pod="paused-pod",
            )
        )
        self.fenced_at_start.append(late.status)
        return {"fence": ctx.fence}


@dataclass
class SteeredStore:
    """A ``MemoryStore`` with a steerable claim and lookup.

    ``claim`` fails ``claim_failures`` times first; with ``lookup_misses``,
    ``lookup`` finds nothing (as if a completion landed just after it).
    """

    inner: MemoryStore
    claim_failures: int = 0
    lookup_misses: bool = False
    claims: list[int] = field(default_factory=list)

    async def claim(self, job_key: str, input_version: str, fence: int) -> ClaimResult:
        """Fail while failures are left, else claim on the inner store."""
        if self.claim_failures:
            self.claim_failures -= 1
            raise StoreUnavailable(job_key, "injected: the store is down")
        self.claims.append(fence)
        return await self.inner.claim(job_key, input_version, fence)

    async def lookup(self, job_key: str, input_version: str) -> Completion | None:
        """The inner store's lookup, or a miss."""
        return (await self.lookup_many([(job_key, input_version)]))[0]

    async def lookup_many(self, identities: Sequence[tuple[str, str]]) -> list[Completion | None]:
        """The inner store's lookups, or misses."""
        if self.lookup_misses:
            return [None] * len(identities)
        return await self.inner.lookup_many(identities)

    async def complete(self, request: CompletionRequest) -> CompletionResult:
        """Complete on the inner store."""
        return await self.inner.complete(request)

    async def state(self, job_key: str) -> Completion | None:
        """The inner store's state."""
        return await self.inner.state(job_key)

    def settled_by_offsets(self) -> SteeredStore:
        """Return this store: its answers are the inner store's."""
        return self

    async def durable(self) -> None:
        """Nothing to wait for (``memory://``)."""

    async def aclose(self) -> None:
        """Close the inner store."""
        await self.inner.aclose()


@dataclass
class Events:
    """(event, outcome, reason) of every execution event."""

    seen: list[tuple[str, str | None, str | None]] = field(default_factory=list)

    def __call__(self, event: Event) -> None:
        """Keep the event's name, outcome and reason."""
        if not isinstance(event, ExecutionEvent) or event.event == "acquiring":
            return
        self.seen.append((event.event, event.outcome, event.reason))


def trigger(version: str) -> Trigger:
    """A trigger of ``KEY`` with input version ``version``."""
    return Trigger(
        topic="t",
        partition=0,
        offset=0,
        key=KEY,
        headers=(),
        timestamp=None,
        payload={"inputVersion": version},
    )


def setup(
    leases: RedisLeases, namespace: str, *, claim_failures: int = 0, lookup_misses: bool = False
) -> tuple[Executor, CountingJob, SteeredStore, Events]:
    """An executor with a counting job, a steered memory store and an event list."""
    inner = MemoryStore()
    store = SteeredStore(inner, claim_failures=claim_failures, lookup_misses=lookup_misses)
    job = CountingJob(inner, namespace)
    events = Events()
    executor = Executor(
        job,
        leases,
        pod="pod-a",
        hooks=[events],
        lost_retry=Backoff(initial=0.01, cap=0.01),
        store=store,
        store_namespace=namespace,
    )
    return executor, job, store, events


def finished(events: Events) -> list[tuple[str | None, str | None]]:
    """(outcome, reason) of every finished execution."""
    return [(outcome, reason) for name, outcome, reason in events.seen if name == "finished"]


async def test_the_job_starts_only_after_the_store_has_seen_its_fence(
    leases: RedisLeases, namespace: str
) -> None:
    """At the first line of ``run``, a completion with a lower fence is already ``stale``."""
    executor, job, store, _ = setup(leases, namespace)
    ending = await executor.run(trigger("v1"), KEY)
    assert (ending.outcome, ending.terminal) == ("completed", True)
    assert store.claims == job.runs
    assert job.fenced_at_start == ["stale"]


async def test_a_failed_claim_keeps_the_job_from_starting_and_is_retried(
    leases: RedisLeases, namespace: str
) -> None:
    """Store down at the claim: ``lost`` (``store_unavailable``), retried; never run unfenced.

    Two claims fail: two executions end ``lost`` without calling ``run``; the
    third claims (with a higher fence: a new acquisition) and completes.
    """
    executor, job, store, events = setup(leases, namespace, claim_failures=2)
    ending = await executor.run(trigger("v1"), KEY)
    assert (ending.outcome, ending.terminal) == ("completed", True)
    assert finished(events) == [
        ("lost", "store_unavailable"),
        ("lost", "store_unavailable"),
        ("completed", None),
    ]
    assert len(job.runs) == 1
    assert store.claims == job.runs


async def test_a_claim_below_a_higher_fence_is_stale_final_and_the_job_never_runs(
    leases: RedisLeases, namespace: str
) -> None:
    """A higher fence claimed the key before this execution could (it was paused past its lease).

    The execution ends ``lost`` (``stale``), terminal: the newer fence took
    the job key over. ``run`` is never called.
    """
    executor, job, store, events = setup(leases, namespace)
    await store.inner.claim(completion_key(namespace, KEY), "newer", 2**62)
    ending = await executor.run(trigger("v1"), KEY)
    assert (ending.outcome, ending.reason, ending.terminal) == ("lost", "stale", True)
    assert finished(events) == [("lost", "stale")]
    assert job.runs == []


async def test_an_identity_completed_since_the_lookup_is_duplicate_at_the_claim(
    leases: RedisLeases, namespace: str
) -> None:
    """The claim is the last duplicate lookup: a completion that landed after the first is seen."""
    executor, job, _, events = setup(leases, namespace, lookup_misses=True)
    first = await executor.run(trigger("v1"), KEY)
    assert first.outcome == "completed"
    again = await executor.run(trigger("v1"), KEY)
    assert (again.outcome, again.terminal) == ("duplicate", True)
    assert len(job.runs) == 1
    assert finished(events)[-1] == ("duplicate", None)
