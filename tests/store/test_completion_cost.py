"""What an execution's ``run_in_process`` children cost, kept with its completion (migration 12).

On every backend, through each way a completion is written (a call, a job's
transaction), and across the migration: rows of earlier code and earlier code
itself keep working, with no cost.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar

import pytest

from leaseworker import (
    CompletionRequest,
    ConfigError,
    JobContext,
    ProcessPool,
    ReportJob,
    open_store,
)
from leaseworker._store import MIGRATIONS, EffectStore, effect_store, parse_store_url
from leaseworker._store._postgres import PostgresStore
from leaseworker._store._sqlite import SqliteStore
from leaseworker.testing import JobEnvironment, make_trigger
from tests import process_work

from .test_store import raw

KEY = "report:acme:2026-11"
MIB = 2**20


def _request(
    fence: int,
    version: str = "v1",
    *,
    cpu_seconds: float | None = None,
    peak_memory: int | None = None,
) -> CompletionRequest:
    return CompletionRequest(
        job_key=KEY,
        input_version=version,
        fence=fence,
        result={"fence": fence},
        execution_id=f"exec-{fence}",
        pod="pod-a",
        cpu_seconds=cpu_seconds,
        peak_memory=peak_memory,
    )


@pytest.fixture(params=["postgresql", "sqlite", "memory"])
async def any_store(
    request: pytest.FixtureRequest, store_url_for: Callable[[str], str]
) -> AsyncIterator[EffectStore]:
    """An open store on each backend in turn, ``memory://`` included."""
    async with open_store(store_url_for(request.param)) as opened:
        yield effect_store(opened)


async def test_the_winning_completion_shows_what_its_execution_cost(
    any_store: EffectStore,
) -> None:
    """state() reads the cost of the completion that won; others' costs never land on it.

    A call with a cost, then a newer fence through a job transaction with its
    own, then a stale one and a duplicate from other executions with theirs,
    and a completion with no cost (an execution that ran no child): ``None``.
    """
    first = await any_store.complete(_request(10, cpu_seconds=1.5, peak_memory=40 * MIB))
    assert first.status == "accepted"
    state = await any_store.state(KEY)
    assert state is not None
    assert (state.cpu_seconds, state.peak_memory) == (1.5, 40 * MIB)
    async with any_store.transaction(KEY, "v2", 20) as tx:
        assert (
            await tx.commit(_request(20, "v2", cpu_seconds=2.25, peak_memory=7), [])
        ).status == ("accepted")
    stale = await any_store.complete(_request(15, "v3", cpu_seconds=9.0, peak_memory=9))
    duplicate = await any_store.complete(
        dataclasses.replace(_request(30, "v2", cpu_seconds=8.0), execution_id="exec-other")
    )
    assert (stale.status, duplicate.status) == ("stale", "duplicate")
    state = await any_store.state(KEY)
    assert state is not None
    assert (state.fence, state.execution_id) == (20, "exec-20")
    assert (state.cpu_seconds, state.peak_memory) == (2.25, 7)
    assert (await any_store.complete(_request(40, "v4"))).status == "accepted"
    state = await any_store.state(KEY)
    assert state is not None
    assert (state.fence, state.cpu_seconds, state.peak_memory) == (40, None, None)


@pytest.mark.parametrize(
    ("cost", "refusal"),
    [
        ({"cpu_seconds": -1.0}, "cpu_seconds must be None or a finite number >= 0"),
        ({"cpu_seconds": float("nan")}, "cpu_seconds must be"),
        ({"cpu_seconds": True}, "cpu_seconds must be"),
        ({"peak_memory": 1.5}, "peak_memory must be None or a whole number >= 0"),
        ({"peak_memory": -2}, "peak_memory must be"),
    ],
)
async def test_a_cost_no_store_could_keep_is_refused_before_any_io(
    any_store: EffectStore, cost: dict[str, Any], refusal: str
) -> None:
    """One ConfigError line; nothing is written."""
    with pytest.raises(ConfigError, match=refusal):
        await any_store.complete(dataclasses.replace(_request(10), **cost))
    assert await any_store.state(KEY) is None


async def test_rows_of_earlier_code_read_without_cost_and_earlier_code_still_completes(
    store_url: str,
) -> None:
    """A completion written before migration 12 reads with no cost once migrated.

    Earlier code's own statement (PostgreSQL: the six-argument
    ``leaseworker_complete``; SQLite: the insert without the new columns)
    still completes after it, beside this code recording its cost.
    """
    parsed = parse_store_url(store_url)
    cost = next(m.version for m in MIGRATIONS if m.description.startswith("what an execution's"))

    async def open_with(count: int) -> PostgresStore | SqliteStore:
        migrations = MIGRATIONS[:count]
        if parsed.backend == "postgresql":
            return await PostgresStore.open(parsed, call_timeout=5.0, migrations=migrations)
        return await SqliteStore.open(parsed, call_timeout=5.0, migrations=migrations)

    async def as_earlier_code(fence: int, version: str) -> None:
        identity = (KEY, version, fence, f'{{"fence": {fence}}}', f"exec-{fence}", "pod-a")
        if parsed.backend == "postgresql":
            await raw(
                store_url, "SELECT * FROM leaseworker_complete(%s, %s, %s, %s, %s, %s)", identity
            )
            return
        await raw(
            store_url,
            "INSERT INTO leaseworker_completions (job_key, input_version, fence, result,"
            " execution_id, pod, completed_at) VALUES (%s, %s, %s, %s, %s, %s, 0)",
            identity,
        )

    await (await open_with(cost - 1)).aclose()
    await as_earlier_code(10, "v1")
    store = await open_with(len(MIGRATIONS))
    try:
        assert store.schema_version == MIGRATIONS[-1].version
        state = await store.state(KEY)
        assert state is not None
        assert (state.fence, state.cpu_seconds, state.peak_memory) == (10, None, None)
        await as_earlier_code(20, "v2")
        state = await store.state(KEY)
        assert state is not None
        assert (state.fence, state.cpu_seconds) == (20, None)
        assert (await store.complete(_request(30, "v3", cpu_seconds=4.0))).status == "accepted"
        state = await store.state(KEY)
        assert state is not None
        assert (state.fence, state.cpu_seconds) == (30, 4.0)
    finally:
        await store.aclose()


class AddJob(ReportJob):
    """Adds the payload's numbers in a child, then completes."""

    topic: ClassVar[str] = "add"

    async def run(self, ctx: JobContext) -> object:
        """Return the child's sum."""
        return await ctx.run_in_process(process_work.add, *ctx.trigger.payload["add"])


async def test_an_execution_completes_with_what_its_children_cost() -> None:
    """The completion an execution records carries the CPU and peak its JobResult reports."""
    async with ProcessPool(1) as pool:
        env = JobEnvironment(AddJob(), processes=pool)
        result = await env.run(make_trigger({"jobId": "r-1", "add": [1, 2]}))
    assert (result.outcome, result.result) == ("completed", 3)
    completion = await env.completion(result.job_key or "")
    assert completion is not None
    assert completion.cpu_seconds == result.cpu_seconds
    assert completion.peak_memory == result.peak_memory
    assert completion.peak_memory is not None
    assert completion.peak_memory > 0
