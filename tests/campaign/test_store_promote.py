"""The campaign's ``store_promote`` fault, played by its injector against real PostgreSQL pairs.

The primary is SIGKILLed and the standby promoted; the former primary's
address then serves a fresh standby, so the URL the pods were given still
names both nodes and the fault can play again. Its window carries what the
promoted node lacks of what the primary had committed: nothing on a
synchronous standby; on an asynchronous one whose WAL sender was stopped
(a lagging standby, made certain), the completions and the claim committed
after it stopped, their keys named.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import anyio
import pytest

from leaseworker import CompletionRequest, open_store
from leaseworker.toolkit import FaultWindow, History, completion_key
from leaseworker_dev._campaign._fault_play import Injector
from leaseworker_dev._campaign._invariant_verdict import Verdict
from leaseworker_dev._campaign._plan import PlannedFault
from leaseworker_dev._campaign._promotion import StoreState, compare, loss_note
from leaseworker_dev._campaign._testbed import Services
from leaseworker_dev._services import LocalPostgresPair, LocalStack

PROMOTE = PlannedFault(kind="store_promote", at=0.0, duration=0.2)


def _services(
    pair: LocalPostgresPair, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Services]:
    """A stack holding only the pair, as the campaign's ``--postgres-standby`` has."""
    try:
        with LocalStack() as stack:
            yield Services(
                stack=stack,
                workdir=tmp_path_factory.mktemp("promote"),
                store_url=pair.url,
                postgres_pair=pair,
            )
    finally:
        pair.stop()


@pytest.fixture
def sync_services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """The campaign's services on a primary and synchronous standby."""
    yield from _services(LocalPostgresPair.start(synchronous=True), tmp_path_factory)


@pytest.fixture
def async_services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """The campaign's services on a primary and asynchronous standby."""
    yield from _services(LocalPostgresPair.start(synchronous=False), tmp_path_factory)


def request(key: str, fence: int) -> CompletionRequest:
    """A completion of ``key``'s v1 at ``fence``."""
    return CompletionRequest(
        job_key=key,
        input_version="v1",
        fence=fence,
        result={"fence": fence},
        execution_id=f"{key}-{fence}",
        pod="pod-a",
    )


KEYS = [completion_key("chaos", f"report:k{i}") for i in range(8)]
CLAIMED = completion_key("chaos", "report:claimed")


async def test_a_synchronous_promotion_loses_nothing_and_can_play_again(
    sync_services: Services,
) -> None:
    """Twice: the primary killed, the standby promoted, a new standby on the old address."""
    pair = sync_services.postgres_pair
    assert pair is not None
    url = pair.url
    injector = Injector(stack=sync_services, pods={}, lease=1.0)
    async with open_store(url, call_timeout=5.0) as store:
        for round_ in range(2):
            primary = pair.primary
            for key in KEYS[round_ * 4 : round_ * 4 + 4]:
                assert (await store.complete(request(key, 10))).status == "accepted"
            assert (await store.claim(CLAIMED, "v1", 20 + round_)).status == "claimed"
            await injector.play(PROMOTE)
            assert primary.process.popen.returncode == -signal.SIGKILL
            assert pair.url == url  # the same two addresses: the pods' URL still reaches it
            assert pair.standby is not None
            pair.wait_streaming(timeout=1.0)  # already: the fault waited for it
            found = await store.lookup_many([(key, "v1") for key in KEYS[: round_ * 4 + 4]])
            assert [c.fence if c else None for c in found] == [10] * (round_ * 4 + 4)
    windows = injector.faults
    assert [w.kind for w in windows] == ["store_promote"] * 2
    for window in windows:
        assert window.end is not None
        assert window.end - window.start >= PROMOTE.duration
        assert window.attrs["synchronous"] is True
        assert [window.attrs[f"lost_{what}"] for what in LOSSES] == [0, 0, 0, 0]
        assert window.attrs["lost_keys"] == ""


LOSSES = ("completions", "claims", "outbox_rows", "sent_marks")


async def test_an_asynchronous_promotion_counts_what_the_standby_had_not_received(
    async_services: Services,
) -> None:
    """The WAL sender stopped, 4 completions and a claim committed: all lost, their keys named."""
    pair = async_services.postgres_pair
    assert pair is not None
    injector = Injector(stack=async_services, pods={}, lease=1.0)
    async with open_store(pair.url, call_timeout=5.0) as store:
        for key in KEYS[:4]:
            assert (await store.complete(request(key, 10))).status == "accepted"
        await anyio.to_thread.run_sync(_caught_up, pair)
        os.kill(pair.walsender_pid(), signal.SIGSTOP)
        for key in KEYS[4:]:
            assert (await store.complete(request(key, 10))).status == "accepted"
        assert (await store.claim(KEYS[0], "v2", 30)).status == "claimed"
        await injector.play(PROMOTE)
        found = await store.lookup_many([(key, "v1") for key in KEYS])
        assert [c is not None for c in found] == [True] * 4 + [False] * 4
    [window] = injector.faults
    assert window.attrs["synchronous"] is False
    lost = [window.attrs[f"lost_{what}"] for what in LOSSES]
    assert lost == [4, 5, 0, 0]  # a claim lost on k0, and the heads of k4..k7 with their rows
    expected = " ".join(sorted(f"report:k{i}" for i in (0, 4, 5, 6, 7)))
    assert window.attrs["lost_keys"] == expected


def _caught_up(pair: LocalPostgresPair) -> None:
    """Block until the standby replayed everything the primary wrote so far."""
    assert pair.standby is not None
    [(written,)] = pair.primary.query(b"SELECT pg_current_wal_insert_lsn()::text")
    replayed = f"SELECT pg_last_wal_replay_lsn() >= '{written}'::pg_lsn".encode()
    deadline = time.monotonic() + 30
    while not pair.standby.query(replayed)[0][0]:
        assert time.monotonic() < deadline, "the standby did not catch up"
        time.sleep(0.02)


def test_the_loss_is_what_the_primary_held_and_the_promoted_node_lacks() -> None:
    """A completion, a head fence gone back, a row and a sent mark; what survived is no loss."""
    a, b, c = "ns:{report:a}", "ns:{report:b}", "ns:{report:c}"
    before = StoreState(
        heads={a: 12, b: 10, c: 7},
        completions=frozenset({(a, "v1"), (b, "v1")}),
        outbox={1: (a, "lw1:x:0"), 2: (b, "lw1:y:0"), 3: (c, "lw1:z:0")},
        sent=frozenset({1, 3}),
    )
    after = StoreState(
        heads={a: 11, b: 10, c: 7},
        completions=frozenset({(a, "v1")}),
        outbox={1: (a, "lw1:x:0"), 3: (c, "lw1:z:0")},
        sent=frozenset({1}),
    )
    loss = compare(before, after)
    assert (loss.completions, loss.claims, loss.outbox_rows, loss.sent_marks) == (1, 1, 1, 1)
    assert loss.keys == ("report:a", "report:b", "report:c")
    assert loss.effects == ("lw1:y:0",)
    assert compare(before, before).keys == ()


def test_the_report_line_sums_the_asynchronous_losses_and_what_they_let_through() -> None:
    """Only asynchronous promotions' windows count; the let-through figures come from verdicts."""
    lost = {"lost_completions": 2, "lost_claims": 3, "lost_outbox_rows": 2, "lost_sent_marks": 1}
    windows = (
        FaultWindow(
            kind="store_promote",
            start=1.0,
            end=2.0,
            attrs={"synchronous": False, **lost, "lost_keys": "k1 k2", "lost_effects": ""},
        ),
        FaultWindow(kind="store_promote", start=5.0, end=6.0, attrs={"synchronous": True}),
    )
    history = History(clock="monotonic", faults=windows)
    found = Verdict(name="x", passed=True, counts={"recomputed_after_loss": 1})
    assert loss_note(history, [found]) == (
        "lost by the asynchronous promotion (1 played): 2 completions, 3 claims, 2 outbox rows,"
        " 1 sent marks (keys: k1 k2); let through: 1 triggers recomputed, 0 lower fences accepted"
    )
    assert loss_note(History(clock="monotonic", faults=windows[1:]), [found]) is None
