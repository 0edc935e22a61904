"""The ``receiver_restart`` fault against a real broker: the receiver's inbox outlives it.

The receiver reads two effects; killed, it processes the next batch (a
redelivery of the first effect) and dies before committing its offsets; its
next life, a new consumer with only the database carried over, reads the
redelivery again and its inbox drops it: each effect processed once, and the
campaign's check says so. A receiver whose inbox did not persist (its inbox
rows deleted while it is down, the effect rows kept) processes it again, and
the same check fails. Given ``topics_of`` (a broker of
``--bootstrap-servers``), it reads only the topics named there, not a
neighbour's on the same broker. The campaign's injector plays the fault.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import anyio
import pytest
from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

from leaseworker._kafka import KafkaSender
from leaseworker._store import Message, OutboxRow
from leaseworker.effects import effect_id
from leaseworker.toolkit import History
from leaseworker_dev._campaign import Records, _receiver
from leaseworker_dev._campaign._campaign_records import Outboxed
from leaseworker_dev._campaign._effect_checks import effects_processed_once
from leaseworker_dev._campaign._fault_play import Injector
from leaseworker_dev._campaign._plan import PlannedFault
from leaseworker_dev._campaign._receiver import Receiver
from leaseworker_dev._services import LocalKafka

from ..kafka_util import KafkaNames

KEY = "report:acme:2026-11"


def _row(topic: str, seq: int) -> OutboxRow:
    return OutboxRow(
        id=seq + 1,
        job_key=f"ns:{{{KEY}}}",
        input_version="v1",
        seq=seq,
        fence=11,
        message=Message.build(topic, {"seq": seq}),
    )


def _outboxed(topic: str, seq: int) -> Outboxed:
    return Outboxed(
        effect_id=effect_id(f"ns:{{{KEY}}}", "v1", seq),
        job_key=KEY,
        input_version="v1",
        fence=11,
        topic=topic,
        committed=0.0,
        sent=0.0,
    )


async def _until(receiver: Receiver, deliveries: int, lives: int = 1) -> None:
    with anyio.fail_after(30):
        while len(receiver.deliveries) < deliveries or receiver.lives < lives:  # noqa: ASYNC110
            await anyio.sleep(0.05)  # a broker's records, another task's consumer


async def _campaign(
    kafka: LocalKafka, names: KafkaNames, workdir: Path, *, lose_inbox: bool
) -> Records:
    """Two effects; a redelivery of the first processed by a life that dies before committing.

    The next life reads the redelivery again: the inbox it kept drops it (or,
    ``lose_inbox``: its inbox rows deleted meanwhile, it processes it again).
    """
    effects, neighbour = f"{names.topic}-fx", f"{names.topic}-theirs"
    kafka.create_topics([effects, neighbour])

    async def topics_of() -> set[str]:
        return {effects}

    receiver = Receiver(kafka.bootstrap_servers, names.group, [], workdir, topics_of=topics_of)
    sender = KafkaSender(kafka.bootstrap_servers, timeout=5.0)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(receiver.run)
            await sender.send(_row(neighbour, 0))  # another campaign's effect: never read
            await sender.send(_row(effects, 0))
            await sender.send(_row(effects, 1))
            await _until(receiver, 2)
            receiver.kill(within=30)  # ends after its next batch, before committing it
            await sender.send(_row(effects, 0))  # at least once: the first effect again
            await _until(receiver, 3)
            if lose_inbox:
                with contextlib.closing(sqlite3.connect(workdir / "receiver.db")) as db:
                    db.execute("DELETE FROM leaseworker_inbox")
                    db.commit()
            receiver.revive()
            await _until(receiver, 4, lives=2)
            tg.cancel_scope.cancel()
    finally:
        await sender.aclose()
    outbox = (_outboxed(effects, 0), _outboxed(effects, 1))
    return Records(
        outbox=outbox, deliveries=tuple(receiver.deliveries), processed=receiver.processed()
    )


@pytest.mark.timeout(90)
async def test_a_restarted_receiver_drops_a_redelivery_with_the_inbox_it_kept(
    kafka_server: LocalKafka, kafka_names: KafkaNames, tmp_path: Path
) -> None:
    """Two lives, four deliveries (the redelivery twice, dropped twice), each processed once."""
    records = await _campaign(kafka_server, kafka_names, tmp_path, lose_inbox=False)
    assert [d.status for d in records.deliveries] == ["new", "new", "duplicate", "duplicate"]
    assert {d.topic for d in records.deliveries} == {f"{kafka_names.topic}-fx"}
    verdict = effects_processed_once(History(), records)
    assert verdict.passed, verdict.violations
    assert verdict.counts["duplicates_dropped"] == 2


@pytest.mark.timeout(90)
async def test_a_receiver_that_lost_its_inbox_processes_the_redelivery_again_and_fails(
    kafka_server: LocalKafka, kafka_names: KafkaNames, tmp_path: Path
) -> None:
    """Planted: the inbox's rows gone across the restart; the checker sees ``processed 2``."""
    records = await _campaign(kafka_server, kafka_names, tmp_path, lose_inbox=True)
    assert [d.status for d in records.deliveries] == ["new", "new", "duplicate", "new"]
    verdict = effects_processed_once(History(), records)
    assert not verdict.passed
    assert verdict.counts["processed_twice"] == 1
    assert any("processed 2 times" in line for line in verdict.violations)


@pytest.mark.timeout(60)
async def test_the_injector_restarts_the_receiver_and_records_the_fault(
    kafka_server: LocalKafka, kafka_names: KafkaNames, tmp_path: Path
) -> None:
    """An idle receiver dies within a second of the kill and comes back after the fault."""
    receiver = Receiver(kafka_server.bootstrap_servers, kafka_names.group, [], tmp_path)
    injector = Injector(stack=None, pods={}, lease=1.0, receiver=receiver)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        tg.start_soon(receiver.run)
        await _until(receiver, 0)
        await injector.play(PlannedFault(kind="receiver_restart", at=0.0, duration=1.5))
        await _until(receiver, 0, lives=2)
        tg.cancel_scope.cancel()
    [fault] = injector.faults
    assert fault.kind == "receiver_restart"
    assert (fault.end or 0) - fault.start >= 1.5


class _DyingConsumer:
    """A consumer whose first ``getmany`` raises what a dead group coordination raises."""

    made = 0

    def __init__(self, **kwargs: object) -> None:
        type(self).made += 1
        self._first = type(self).made == 1

    def subscribe(self, pattern: str) -> None:
        pass

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def getmany(self, timeout_ms: int) -> dict[object, list[object]]:
        if self._first:
            raise KafkaError("Unexpected error during coordination AssertionError()")
        await anyio.sleep(timeout_ms / 1000)
        return {}

    def assignment(self) -> set[object]:
        return set()


@pytest.mark.timeout(30)
async def test_a_consumer_error_starts_the_next_life_and_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiokafka#796: the error getmany raises once its coordination died ends one life only."""
    monkeypatch.setattr(_receiver, "AIOKafkaConsumer", _DyingConsumer)
    receiver = Receiver("127.0.0.1:1", "group", [], tmp_path)
    async with anyio.create_task_group() as tg:
        tg.start_soon(receiver.run)
        await _until(receiver, 0, lives=2)  # no revive: the receiver restarts on its own
        tg.cancel_scope.cancel()
    assert receiver.consumer_errors == [
        "KafkaError: KafkaError: Unexpected error during coordination AssertionError()"
    ]
    records = Records(outbox=(_outboxed("fx", 0),), receiver_errors=(receiver.consumer_errors[0],))
    verdict = effects_processed_once(History(), records)
    assert verdict.passed, verdict.violations
    assert verdict.counts["receiver_consumer_errors"] == 1
