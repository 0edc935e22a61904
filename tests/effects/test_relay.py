"""The outbox relay: each key's messages in commit order, marked sent only once acknowledged.

The first tests use a fake sender (the logic: order, failures, cancellation,
takeover); the last ones a real broker and a real PostgreSQL store: a relay
killed between the broker's acknowledgement and its mark, and a broker
restart, with a receiver's inbox processing every effect exactly once.
"""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest

from leaseworker import Backoff, CompletionRequest, StoreUnavailable, open_store
from leaseworker._kafka import KafkaSender
from leaseworker._store import EffectStore, Message, OutboxRow, effect_store
from leaseworker.effects import Effect, MemoryInbox, Relay
from leaseworker_dev._services import LocalKafka

from ..kafka_util import KafkaNames, read_topic


class FakeSender:
    """Acknowledges every row, except those whose value is in ``refuse``; may block on one."""

    def __init__(self, refuse: frozenset[bytes] = frozenset()) -> None:
        self.refuse = refuse
        self.sent: list[tuple[str, bytes]] = []
        self.block_on: bytes | None = None
        self.blocked = anyio.Event()

    async def send_batch(self, rows: Sequence[OutboxRow]) -> list[tuple[int, int] | Exception]:
        """Acknowledge each row, or fail it as a broker that is down would."""
        outcomes: list[tuple[int, int] | Exception] = []
        for row in rows:
            if row.message.value == self.block_on:
                self.blocked.set()
                await anyio.sleep_forever()
            if row.message.value in self.refuse:
                outcomes.append(ConnectionError("broker down"))
                continue
            self.sent.append((row.job_key, row.message.value))
            outcomes.append((0, len(self.sent) - 1))
        return outcomes


class Counting:
    """Forwards to ``inner``; ``reached`` is set once ``target`` sends were acknowledged.

    ``failed`` is set once a send answered with a failure.
    """

    def __init__(self, inner: KafkaSender | FakeSender, target: int) -> None:
        self.inner = inner
        self.target = target
        self.acked = 0
        self.reached = anyio.Event()
        self.failed = anyio.Event()

    async def send_batch(self, rows: Sequence[OutboxRow]) -> list[tuple[int, int] | Exception]:
        """Send through ``inner`` and count the acknowledgements."""
        outcomes = await self.inner.send_batch(rows)
        self.acked += sum(not isinstance(outcome, Exception) for outcome in outcomes)
        if self.acked >= self.target:
            self.reached.set()
        if any(isinstance(outcome, Exception) for outcome in outcomes):
            self.failed.set()
        return outcomes


async def commit(store: EffectStore, key: str, fence: int, *values: bytes) -> None:
    """Commit one execution of ``key`` at ``fence`` with messages ``values``."""
    async with store.transaction(key, f"v{fence}", fence) as tx:
        request = CompletionRequest(
            job_key=key,
            input_version=f"v{fence}",
            fence=fence,
            result=None,
            execution_id=f"e{fence}",
            pod="p",
        )
        await tx.commit(request, [Message.build("effects", value) for value in values])


@pytest.fixture
async def memory() -> AsyncIterator[EffectStore]:
    """An empty ``memory://`` store."""
    async with open_store("memory://") as opened:
        yield effect_store(opened)


async def test_each_keys_messages_go_in_commit_order_and_only_acknowledged_ones_are_marked(
    memory: EffectStore,
) -> None:
    """k1's first message fails: its second waits (not sent, not marked); k2's go through.

    Next round, with the broker back, k1's two go in order; everything is marked sent.
    """
    await commit(memory, "k1", 1, b"k1-a", b"k1-b")
    await commit(memory, "k2", 2, b"k2-a")
    await commit(memory, "k2", 3, b"k2-b")
    sender = FakeSender(refuse=frozenset({b"k1-a"}))
    relay = Relay(memory, sender, name="relay-a")
    assert await relay.relay_once() == (4, 1)
    assert sender.sent == [("k2", b"k2-a"), ("k2", b"k2-b")]
    assert [sent for _, sent in await memory.outbox("k1")] == [False, False]
    sender.refuse = frozenset()
    assert await relay.relay_once() == (2, 0)
    assert sender.sent[2:] == [("k1", b"k1-a"), ("k1", b"k1-b")]
    assert all(sent for _, sent in await memory.outbox())
    assert relay.sent == 4


async def test_a_relay_stopped_mid_round_releases_what_it_did_not_send(
    memory: EffectStore,
) -> None:
    """Cancelled while a send hangs: acknowledged rows are marked, the rest released at once."""
    await commit(memory, "k1", 1, b"one", b"two")
    await commit(memory, "k2", 2, b"three")
    sender = FakeSender()
    sender.block_on = b"two"
    relay = Relay(memory, sender, name="relay-a", hold=300)
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.relay_once)
        await sender.blocked.wait()
        tg.cancel_scope.cancel()
    assert {value for _, value in sender.sent} == {b"one", b"three"}
    taken = await memory.claim_outbox("relay-b", limit=10, hold=300)
    assert [row.message.value for row in taken] == [b"two"]


async def test_another_relay_takes_over_a_dead_relays_claims_once_they_expire(
    memory: EffectStore,
) -> None:
    """Relay A claims and dies (never sends, never marks); B sends everything after ``hold``."""
    await commit(memory, "k1", 1, b"one", b"two")
    hold = 1.0  # B's first round must come within it: a loaded machine stalls far less
    assert len(await memory.claim_outbox("relay-a", limit=10, hold=hold)) == 2
    expired = time.monotonic() + hold  # the store's clock: A's claim has ended by then
    sender = FakeSender()
    relay_b = Relay(memory, sender, name="relay-b")
    assert await relay_b.relay_once() == (0, 0)  # still A's
    await anyio.sleep(max(0.0, expired - time.monotonic()) + 0.01)
    assert await relay_b.relay_once() == (2, 0)
    assert sender.sent == [("k1", b"one"), ("k1", b"two")]


async def test_run_stops_after_its_round_when_told(memory: EffectStore) -> None:
    """``run(stop)`` relays what is committed and returns once ``stop`` is set (SIGTERM)."""
    await commit(memory, "k1", 1, b"one")
    sender = FakeSender()
    counting = Counting(sender, 1)
    stop = anyio.Event()
    relay = Relay(memory, counting, name="relay-a", idle=0.01)
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run, stop)
        with anyio.fail_after(5):
            await counting.reached.wait()
        stop.set()
    assert sender.sent == [("k1", b"one")]
    assert relay.sent == 1


def receive(records: list[Any], inbox: MemoryInbox) -> list[tuple[str, str]]:
    """Pass ``records`` through ``inbox``; return (effect id, answer) per record."""
    answers: list[tuple[str, str]] = []
    for record in records:
        effect = Effect.from_headers(record.headers)
        assert effect is not None
        answers.append((effect.effect_id, inbox.accept(effect)))
    return answers


@pytest.fixture
async def pg(store_url_for: Callable[[str], str]) -> AsyncIterator[EffectStore]:
    """A PostgreSQL store of the test's own."""
    async with open_store(store_url_for("postgresql")) as opened:
        yield effect_store(opened)


async def test_a_relay_killed_between_the_acknowledgement_and_its_mark_loses_nothing(
    pg: EffectStore, kafka_server: LocalKafka, kafka_names: KafkaNames
) -> None:
    """A sends to the real broker and dies before marking; B sends again after A's claim expires.

    The topic holds every message twice; the receiver's inbox processes each
    effect once and drops the second copy as a duplicate; all rows end sent.
    """
    topic = f"{kafka_names.topic}-effects"
    kafka_server.create_topics([topic])
    for fence in (1, 2, 3):
        async with pg.transaction("k1", f"v{fence}", fence) as tx:
            request = CompletionRequest(
                job_key="k1",
                input_version=f"v{fence}",
                fence=fence,
                result=None,
                execution_id=f"e{fence}",
                pod="p",
            )
            await tx.commit(request, [Message.build(topic, {"n": fence})])
    sender = KafkaSender(kafka_server.bootstrap_servers)
    try:
        for row in await pg.claim_outbox("relay-a", limit=10, hold=0.5):
            await sender.send(row)  # acknowledged; relay A is killed before it marks
        await anyio.sleep(0.6)
        relay_b = Relay(pg, sender, name="relay-b")
        assert await relay_b.relay_once() == (3, 0)
    finally:
        await sender.aclose()
    assert all(sent for _, sent in await pg.outbox())
    records = await read_topic(kafka_server.bootstrap_servers, topic, 6)
    answers = receive(records, MemoryInbox())
    assert [answer for _, answer in answers] == ["new"] * 3 + ["duplicate"] * 3
    fences = [int(dict(r.headers)["leaseworker-fence"]) for r in records[:3]]
    assert fences == [1, 2, 3]  # commit order


class Stalling:
    """Acknowledges every row, but only once ``go`` is set (a relay paused mid-send)."""

    def __init__(self) -> None:
        self.entered = anyio.Event()
        self.go = anyio.Event()

    async def send_batch(self, rows: Sequence[OutboxRow]) -> list[tuple[int, int] | Exception]:
        """Wait for ``go``, then acknowledge all."""
        self.entered.set()
        await self.go.wait()
        return [(0, n) for n, _ in enumerate(rows)]


async def test_a_paused_relays_claim_lapses_after_hold_and_its_late_mark_marks_nothing(
    pg: EffectStore,
) -> None:
    """PostgreSQL: A's claim is row locks in an open transaction; A stalls in its send.

    After ``hold`` the server ends A's idle session, so B claims, sends and
    marks the message; A's send then returns acknowledged, but its mark finds
    its transaction gone and marks nothing: the row counts B's attempt only.
    """
    await commit(pg, "k1", 1, b"one")
    stalling, sender_b = Stalling(), FakeSender()
    relay_a = Relay(pg, stalling, name="relay-a", hold=0.5)
    relay_b = Relay(pg, sender_b, name="relay-b")
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay_a.relay_once)
        await stalling.entered.wait()
        assert await relay_b.relay_once() == (0, 0)  # A's locks hold it
        with anyio.fail_after(10):
            while await relay_b.relay_once() == (0, 0):  # noqa: ASYNC110 - the server ends A's session
                await anyio.sleep(0.05)
        stalling.go.set()
    assert sender_b.sent == [("k1", b"one")]
    assert (relay_a.sent, relay_b.sent) == (0, 1)
    [entry] = await pg.outbox_entries()
    assert entry.sent
    assert entry.attempts == 1


async def test_a_mark_is_timed_when_it_runs_not_when_its_claim_began(pg: EffectStore) -> None:
    """PostgreSQL: claim and mark share a transaction; ``sent_at`` is the mark's time.

    A receiver's checks compare it with the broker's record time: a mark
    dated at the claim would look earlier than the acknowledgement.
    """
    await commit(pg, "k1", 1, b"one")
    rows = await pg.claim_outbox("relay-a", limit=10, hold=30)
    await anyio.sleep(0.3)  # the send, as long as it takes
    before_mark = datetime.now(UTC)
    assert await pg.mark_sent("relay-a", [row.id for row in rows]) == 1
    [entry] = await pg.outbox_entries()
    assert entry.sent_at is not None
    assert entry.sent_at >= before_mark - timedelta(milliseconds=50)


async def test_a_broker_restart_delays_messages_but_loses_none(
    pg: EffectStore, kafka_server: LocalKafka, kafka_names: KafkaNames
) -> None:
    """Messages committed while the broker is down are sent once it is back, each marked once.

    No row is marked sent before the broker has it: while it is down, every
    row stays unsent.
    """
    topic = f"{kafka_names.topic}-effects-restart"
    kafka_server.create_topics([topic])
    sender = KafkaSender(kafka_server.bootstrap_servers, timeout=2.0)
    counting = Counting(sender, 2)
    stop = anyio.Event()
    relay = Relay(pg, counting, name="relay-a", idle=0.05, hold=5.0)
    try:
        await anyio.to_thread.run_sync(kafka_server.down)
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.run, stop)
            for fence in (1, 2):
                async with pg.transaction("k1", f"v{fence}", fence) as tx:
                    request = CompletionRequest(
                        job_key="k1",
                        input_version=f"v{fence}",
                        fence=fence,
                        result=None,
                        execution_id=f"e{fence}",
                        pod="p",
                    )
                    await tx.commit(request, [Message.build(topic, {"n": fence})])
            with anyio.fail_after(60):
                await counting.failed.wait()  # the relay tried the down broker
            assert [sent for _, sent in await pg.outbox()] == [False, False]
            await anyio.to_thread.run_sync(kafka_server.up)
            with anyio.fail_after(60):
                await counting.reached.wait()
            stop.set()  # the round finishes: its rows are marked
    finally:
        await sender.aclose()
        await anyio.to_thread.run_sync(kafka_server.up)
    assert relay.sent == 2
    assert all(sent for _, sent in await pg.outbox())
    records = await read_topic(kafka_server.bootstrap_servers, topic, 2)
    answers = receive(records, MemoryInbox())
    assert [answer for _, answer in answers] == ["new", "new"]
    assert [int(dict(r.headers)["leaseworker-fence"]) for r in records] == [1, 2]


class DownFor:
    """An effect store whose relay calls fail ``calls`` times (a store outage), then pass."""

    def __init__(self, inner: EffectStore, calls: int) -> None:
        self.inner = inner
        self.calls = calls

    async def claim_outbox(self, relay: str, *, limit: int, hold: float) -> list[OutboxRow]:
        """Fail while the outage lasts, else claim on the inner store."""
        if self.calls:
            self.calls -= 1
            raise StoreUnavailable(None, "injected outage")
        return await self.inner.claim_outbox(relay, limit=limit, hold=hold)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_store_outage_is_waited_out_and_nothing_is_lost(memory: EffectStore) -> None:
    """Three failed claims (store down): the relay backs off and then sends everything once."""
    await commit(memory, "k1", 1, b"one", b"two")
    sender = FakeSender()
    counting = Counting(sender, 2)
    stop = anyio.Event()
    flaky = DownFor(memory, 3)
    relay = Relay(flaky, counting, name="relay-a", retry=Backoff(initial=0.01, cap=0.02))
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run, stop)
        with anyio.fail_after(5):
            await counting.reached.wait()
        stop.set()
    assert flaky.calls == 0
    assert sender.sent == [("k1", b"one"), ("k1", b"two")]
    assert all(sent for _, sent in await memory.outbox())


async def test_brokers_down_at_start_fail_a_round_of_many_keys_in_one_timeout(
    memory: EffectStore,
) -> None:
    """Ten keys, a broker that never answers: one failed start answers every chain.

    A start per key would take 10 x 0.5 s; the round ends after one.
    """
    for n in range(10):
        await commit(memory, f"k{n}", n + 1, b"x")
    with socket.socket() as silent:  # accepts connections (backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        port = silent.getsockname()[1]
        sender = KafkaSender(f"127.0.0.1:{port}", timeout=0.5)
        relay = Relay(memory, sender, name="relay-a")
        try:
            with anyio.fail_after(3):
                assert await relay.relay_once() == (10, 10)
        finally:
            await sender.aclose()
    assert not any(sent for _, sent in await memory.outbox())


class HeldMarks:
    """Holds the store's marks until ``release`` is set; ``both`` is set once two wait at once."""

    def __init__(self, store: EffectStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.mark_sent = store.mark_sent
        self.waiting = 0
        self.both, self.release = anyio.Event(), anyio.Event()
        monkeypatch.setattr(store, "mark_sent", self.held)

    async def held(self, claimer: str, ids: Sequence[int]) -> int:
        """Wait for ``release``, then mark."""
        self.waiting += 1
        if self.waiting == 2:
            self.both.set()
        await self.release.wait()
        return await self.mark_sent(claimer, ids)

    async def run(self, relay: Relay) -> None:
        """Run ``relay`` until two marks wait at once, then release them and stop it."""
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.run, stop)
            try:
                with anyio.fail_after(10):
                    await self.both.wait()
            finally:  # the marks are shielded: let them end whatever happened
                self.release.set()
                stop.set()  # run returns once its rounds are done


async def test_rounds_whose_marks_overlap_each_count_their_rows(
    memory: EffectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two rounds' marks are awaited at once: ``relay.sent`` counts both (it once kept one)."""
    await commit(memory, "k1", 1, b"one")
    await commit(memory, "k2", 2, b"two")
    marks = HeldMarks(memory, monkeypatch)
    relay = Relay(memory, FakeSender(), name="relay-a", batch=1, in_flight=2)
    await marks.run(relay)  # each round holds one row and waits in its mark
    assert relay.sent == 2


async def test_the_next_claim_goes_out_while_a_rounds_mark_is_still_on_its_way(
    memory: EffectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One round in flight: its mark no longer holds the slot, so the next round claims and sends.

    Both marks wait at once (with the slot held until the mark, the second
    round never started); the rows of either are marked once each.
    """
    await commit(memory, "k1", 1, b"one")
    await commit(memory, "k2", 2, b"two")
    marks = HeldMarks(memory, monkeypatch)
    sender = FakeSender()
    relay = Relay(memory, sender, name="relay-a", batch=1, in_flight=1)
    await marks.run(relay)
    assert sorted(sender.sent) == [("k1", b"one"), ("k2", b"two")]
    assert relay.sent == 2
    assert all(sent for _, sent in await memory.outbox())


async def test_the_next_claim_is_asked_for_before_the_round_just_claimed_sends(
    memory: EffectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a slot free, the relay claims again before the round it started builds its wave.

    The build is CPU without a yield: a claim asked for after it left the
    store idle meanwhile (anyio's ``acquire`` yields even on a free slot,
    and the round ran first: claim, send, claim, send).
    """
    for n in range(3):
        await commit(memory, f"k{n}", n + 1, b"m")
    calls: list[str] = []
    claim_outbox = memory.claim_outbox

    async def claim(relay: str, *, limit: int, hold: float) -> list[OutboxRow]:
        calls.append("claim")
        return await claim_outbox(relay, limit=limit, hold=hold)

    class Logged(FakeSender):
        async def send_batch(self, rows: Sequence[OutboxRow]) -> list[tuple[int, int] | Exception]:
            calls.append("send")
            return await super().send_batch(rows)

    monkeypatch.setattr(memory, "claim_outbox", claim)
    sender = Logged()
    counting = Counting(sender, 3)
    relay = Relay(memory, counting, name="relay-a", batch=1, in_flight=2, linger=0)
    stop = anyio.Event()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.run, stop)
            await counting.reached.wait()
            stop.set()
    assert calls[:3] == ["claim", "claim", "send"]


async def test_a_stop_while_the_relay_waits_for_a_slot_ends_its_run_at_once(
    memory: EffectStore,
) -> None:
    """Stopped while its one round sends, the relay claims once more, finds nothing, and returns.

    It once read the bell's count only after the slot came free, missed the
    stop's ring and slept its whole idle interval (60 s here) before returning.
    """
    await commit(memory, "k1", 1, b"one")
    sending, go_on = anyio.Event(), anyio.Event()

    class Held(FakeSender):
        async def send_batch(self, rows: Sequence[OutboxRow]) -> list[tuple[int, int] | Exception]:
            sending.set()
            await go_on.wait()
            return await super().send_batch(rows)

    relay = Relay(memory, Held(), name="relay-a", in_flight=1, idle=60, idle_max=60, linger=0)
    stop = anyio.Event()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.run, stop)
            await sending.wait()
            await anyio.wait_all_tasks_blocked()  # the loop waits for the round's slot
            stop.set()
            await anyio.wait_all_tasks_blocked()  # the stop's ring is rung
            go_on.set()
    assert relay.sent == 1
