"""The campaign's effect faults and receiver against a real broker.

``effects_refused`` must make the relay's sends fail (a fault that cannot
bite proves nothing: on Kafka 4 ``min.insync.replicas`` above a topic's
replicas did not), and lifting it must let them through; the
receiver must see every record of the effects topics (and none of the
triggers'), and process a message sent twice once.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from leaseworker._kafka import KafkaSender
from leaseworker._store import Message, OutboxRow
from leaseworker_dev._campaign._campaign_records import Delivery
from leaseworker_dev._campaign._fault_play import refuse_records
from leaseworker_dev._campaign._receiver import Receiver, effects_pattern
from leaseworker_dev._services import LocalKafka

from ..kafka_util import KafkaNames, produce


def _row(topic: str) -> OutboxRow:
    """The test's one effect: its id is the topic's own, so no other test's record dedups it.

    The receiver reads every effects topic on the broker, other tests' too, and
    its inbox drops a message whose effect id it has seen on any of them.
    """
    return OutboxRow(
        id=1,
        job_key=f"ns:{{report:{topic}}}",
        input_version="v1",
        seq=0,
        fence=11,
        message=Message.build(topic, {"ready": True}),
    )


def _ours(receiver: Receiver, topic: str) -> list[Delivery]:
    """Return the deliveries from ``topic`` (the pattern matches other tests' topics too)."""
    return [d for d in receiver.deliveries if d.topic == topic]


def test_the_pattern_leaves_out_the_triggers_dead_letters_and_internal_topics() -> None:
    """Every other topic is an effects topic."""
    import re

    pattern = re.compile(effects_pattern("reports.requested", "reports.requested.dead"))
    assert pattern.match("reports.ready")
    assert pattern.match("reports.requested.done")
    assert not pattern.match("reports.requested")
    assert not pattern.match("reports.requested.dead")
    assert not pattern.match("__consumer_offsets")


@pytest.mark.timeout(90)
async def test_refused_sends_fail_then_pass_and_the_receiver_processes_a_resend_once(
    kafka_server: LocalKafka, kafka_names: KafkaNames, tmp_path: Path
) -> None:
    """max.message.bytes 1: the send fails; without the override it lands, and again."""
    effects, triggers = f"{kafka_names.topic}-fx", kafka_names.topic
    kafka_server.create_topics([effects, triggers])
    bootstrap = kafka_server.bootstrap_servers
    sender = KafkaSender(bootstrap, timeout=2.0)
    receiver = Receiver(bootstrap, kafka_names.group, [triggers], tmp_path)
    try:
        await sender.send(_row(effects))  # the producer connected
        await refuse_records(bootstrap, [effects], refuse=True)
        with pytest.raises(Exception):  # noqa: B017, PT011 - the broker's refusal, however wrapped
            await sender.send(_row(effects))
        await refuse_records(bootstrap, [effects], refuse=False)
        await sender.send(_row(effects))  # at least once: a resend of the same effect
    finally:
        await sender.aclose()
    await produce(bootstrap, triggers, [(None, b"{}")])  # not an effects topic: never read
    async with anyio.create_task_group() as tg:
        tg.start_soon(receiver.run)
        with anyio.fail_after(30):
            while len(_ours(receiver, effects)) < 2:  # noqa: ASYNC110 - a broker's records
                await anyio.sleep(0.05)
        processed = receiver.processed()
        tg.cancel_scope.cancel()
    statuses = [d.status for d in _ours(receiver, effects)]
    assert statuses[0] == "new"
    assert set(statuses[1:]) == {"duplicate"}
    assert triggers not in {d.topic for d in receiver.deliveries}
    assert processed[_ours(receiver, effects)[0].effect_id or ""] == 1
