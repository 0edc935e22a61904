"""Claims: the fence an execution shows the store before its job runs, on every backend.

A claim makes every lower fence of the job key ``stale`` from then on, whether
or not the claimer ever completes; claims only rise, survive a reopen, and an
existing database gains them by migration. Tests that need no database of
their own run on all three backends (``any_store``), the others on the two
durable ones (``store_url``).
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable

import anyio
import pytest

from leaseworker import ClaimResult, CompletionStore, ConfigError, open_store
from leaseworker._store import (
    MIGRATIONS,
    NO_FENCE,
    Completion,
    Head,
    decide,
    decide_claim,
    parse_store_url,
)
from leaseworker._store._postgres import PostgresStore
from leaseworker._store._sqlite import SqliteStore

from .test_store import complete, raw


@pytest.fixture(params=["postgresql", "sqlite", "memory"])
async def any_store(
    request: pytest.FixtureRequest, store_url_for: Callable[[str], str]
) -> AsyncIterator[CompletionStore]:
    """An open store on each backend in turn, ``memory://`` included."""
    async with open_store(store_url_for(request.param)) as opened:
        yield opened


async def test_a_claim_makes_lower_fences_stale_even_with_no_completion(
    any_store: CompletionStore,
) -> None:
    """The issue's hole: B claimed (fence 20) and has not completed; A (fence 10) wakes.

    A's completion is ``stale`` with winning fence 20 and no completion to
    show; nothing of A's is stored. B then completes and is ``accepted``.
    """
    claim = await any_store.claim("k", "request-b", 20)
    assert (claim.status, claim.fence, claim.highest_fence) == ("claimed", 20, 20)
    assert claim.completion is None
    late = await complete(any_store, "k", "request-a", 10)
    assert (late.status, late.fence, late.winning_fence) == ("stale", 10, 20)
    assert late.completion is None
    assert late.result is None
    assert await any_store.lookup("k", "request-a") is None
    assert await any_store.state("k") is None
    own = await complete(any_store, "k", "request-b", 20, {"pod": "b"})
    assert (own.status, own.winning_fence) == ("accepted", 20)
    state = await any_store.state("k")
    assert state is not None
    assert (state.input_version, state.fence, state.result) == ("request-b", 20, {"pod": "b"})
    again = await complete(any_store, "k", "request-c", 15)
    assert again.status == "stale"
    assert again.completion == state  # once there is one, stale shows the winning completion


async def test_claims_only_rise(any_store: CompletionStore) -> None:
    """A lower claim never lowers a higher one: it is answered ``stale`` and changes nothing."""
    assert (await any_store.claim("k", "v1", 20)).status == "claimed"
    lower = await any_store.claim("k", "v2", 10)
    assert (lower.status, lower.highest_fence) == ("stale", 20)
    assert (await complete(any_store, "k", "v3", 15)).status == "stale"  # 20 still stands
    higher = await any_store.claim("k", "v4", 30)
    assert (higher.status, higher.highest_fence) == ("claimed", 30)
    assert (await complete(any_store, "k", "v1", 20)).status == "stale"  # taken over by 30
    assert (await complete(any_store, "k", "v5", 35)).status == "accepted"


async def test_a_claim_answers_duplicate_for_a_completed_identity_and_still_counts(
    any_store: CompletionStore,
) -> None:
    """The claim is also the last duplicate lookup: it returns the identity's completion.

    A claim below an accepted fence is ``stale``; a claim of a completed
    identity is ``duplicate`` with that completion, and its fence is recorded
    all the same. Claims are per job key.
    """
    first = await complete(any_store, "k", "v1", 10, {"total": 1})
    below = await any_store.claim("k", "v2", 5)
    assert (below.status, below.highest_fence, below.completion) == ("stale", 10, None)
    dup = await any_store.claim("k", "v1", 20)
    assert (dup.status, dup.highest_fence) == ("duplicate", 20)
    assert dup.completion == first.completion
    assert (await complete(any_store, "k", "v2", 15)).status == "stale"
    assert (await any_store.claim("other", "v2", 1)).status == "claimed"


async def test_claim_arguments_are_checked_before_any_io(any_store: CompletionStore) -> None:
    """A fence no store could keep, or an unstorable job key, is a ConfigError."""
    for bad in (-1, 2**63, True):
        with pytest.raises(ConfigError, match="fence"):
            await any_store.claim("k", "v", bad)
    with pytest.raises(ConfigError, match="job key"):
        await any_store.claim("k\x00", "v", 1)


@pytest.mark.parametrize("seed", [3, 11, 2026])
async def test_every_claim_and_completion_answer_matches_the_reference_rule(
    any_store: CompletionStore, seed: int
) -> None:
    """Model check: 80 random claims and completions over 2 job keys, each answered as modelled.

    ``decide`` and ``decide_claim`` with the job key's head and highest claim
    are the reference; status and the highest fence seen must agree at every
    step.
    """
    rng = random.Random(seed)
    heads: dict[str, Head] = {}
    claims: dict[str, int] = {}
    done: dict[tuple[str, str], Completion] = {}
    for _ in range(80):
        key, version, fence = rng.choice("ab"), f"v{rng.randrange(4)}", rng.randrange(1, 12)
        standing, head = done.get((key, version)), heads.get(key)
        claimed = claims.get(key, NO_FENCE)
        if rng.random() < 0.4:
            answer: ClaimResult = await any_store.claim(key, version, fence)
            assert answer.status == decide_claim(standing, head, fence, claimed=claimed)
            claims[key] = max(claimed, fence)
            assert answer.completion == standing
            seen = answer.highest_fence
        else:
            result = await complete(any_store, key, version, fence)
            assert result.status == decide(standing, head, fence, claimed=claimed)
            if result.status == "accepted":
                assert result.completion is not None
                heads[key] = Head(fence=fence, input_version=version)
                done[(key, version)] = result.completion
            seen = result.winning_fence
        head_fence = heads[key].fence if key in heads else NO_FENCE
        assert seen == max(head_fence, claims.get(key, NO_FENCE))


async def test_claims_survive_a_reopen(store_url: str) -> None:
    """Durable: a claim made before the store (pod, database client) restarts still fences."""
    async with open_store(store_url) as first:
        assert (await first.claim("k", "v-new", 20)).status == "claimed"
    async with open_store(store_url) as second:
        late = await complete(second, "k", "v-old", 10)
        assert (late.status, late.winning_fence) == ("stale", 20)
        assert (await second.claim("k", "v-other", 15)).status == "stale"


async def test_a_version_2_database_gains_claims_by_migration(store_url: str) -> None:
    """An existing database (schema 2, with completions) migrates to claims and keeps its data.

    Its heads start unclaimed (-1), its completions still answer ``duplicate``
    and fence as before, and claims work at once.
    """
    parsed = parse_store_url(store_url)

    async def open_with(count: int) -> PostgresStore | SqliteStore:
        migrations = MIGRATIONS[:count]
        if parsed.backend == "postgresql":
            return await PostgresStore.open(parsed, call_timeout=5.0, migrations=migrations)
        return await SqliteStore.open(parsed, call_timeout=5.0, migrations=migrations)

    old = await open_with(2)
    await old.aclose()
    # What a pod of schema 2 left behind: a head row and its completion.
    now = "1" if parsed.backend == "sqlite" else "now()"
    await raw(
        store_url,
        "INSERT INTO leaseworker_jobs (job_key, fence, input_version, updated_at)"
        f" VALUES ('k', 10, 'v1', {now})",
    )
    await raw(
        store_url,
        "INSERT INTO leaseworker_completions (job_key, input_version, fence, result,"
        f" execution_id, pod, completed_at) VALUES ('k', 'v1', 10, '{{}}', 'e', 'p', {now})",
    )
    new = await open_with(len(MIGRATIONS))
    try:
        assert new.schema_version == len(MIGRATIONS)
        assert await raw(store_url, "SELECT claimed_fence FROM leaseworker_jobs") == [(-1,)]
        assert (await complete(new, "k", "v1", 11)).status == "duplicate"
        assert (await complete(new, "k", "v2", 9)).status == "stale"
        assert (await new.claim("k", "v3", 20)).status == "claimed"
        assert (await complete(new, "k", "v2", 15)).status == "stale"
        state = await new.state("k")
        assert state is not None
        assert (state.input_version, state.fence) == ("v1", 10)
    finally:
        await new.aclose()


async def test_a_claim_racing_a_lower_completion_of_the_identity_decides_one_way(
    store: CompletionStore,
) -> None:
    """Claim-and-lookup is atomic: the lower completion lands before the claim, or is stale.

    For 20 job keys at once, B claims (fence 2) while A completes the same
    identity (fence 1). Either A is ``accepted`` and B's claim sees it
    (``duplicate``: B need not run), or B's claim came first and A is
    ``stale``: never A accepted while B runs.
    """
    gate = anyio.Event()
    answers: dict[str, tuple[str, str]] = {}

    async def race(key: str) -> None:
        statuses: dict[str, str] = {}

        async def claim() -> None:
            await gate.wait()
            statuses["b"] = (await store.claim(key, "v", 2)).status

        async def finish() -> None:
            await gate.wait()
            statuses["a"] = (await complete(store, key, "v", 1)).status

        async with anyio.create_task_group() as tg:
            tg.start_soon(claim)
            tg.start_soon(finish)
        answers[key] = (statuses["a"], statuses["b"])

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(race, f"k{i}")
        gate.set()
    assert set(answers.values()) <= {("accepted", "duplicate"), ("stale", "claimed")}
