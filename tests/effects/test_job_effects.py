"""A job's transaction and messages in ``JobEnvironment``: what users' CI can check.

The run goes through the pod's executor on ``memory://``; ``JobResult``
lists the statements and messages committed, none for a refused run. A
``Superseded`` fault lands just before the transaction, as a paused pod's
takeover would.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
from typing import Any, ClassVar

from leaseworker import JobContext, ReportJob
from leaseworker._store import Message, decode_headers, encode_headers, outbox_row
from leaseworker.effects import EFFECT_ID_HEADER, FENCE_HEADER, JOB_KEY_HEADER, OutboxRow, effect_id
from leaseworker.testing import JobEnvironment, StoreOutage, Superseded, make_trigger

INSERT = "INSERT INTO report (tenant, total) VALUES (%s, %s)"
TRACEPARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRIGGER = make_trigger(
    {"tenant": "acme"}, key="report:acme", headers=[("traceparent", TRACEPARENT)]
)


class RowAndMessage(ReportJob):
    """Writes its row and publishes ``reports.ready`` in the completion's transaction."""

    topic = "reports.requested"
    runs: ClassVar[int] = 0

    async def run(self, ctx: JobContext) -> object:
        """Write one row, publish one message, complete with the total."""
        type(self).runs += 1
        async with ctx.transaction() as tx:
            await tx.execute(INSERT, ("acme", 3))
            tx.publish("reports.ready", {"tenant": "acme"}, key="acme", headers={"kind": "ready"})
            tx.complete({"total": 3})
        return "not the result: tx.complete named it"


class PublishOnly(ReportJob):
    """Has no rows of its own: its message commits with the completion."""

    topic = "reports.requested"
    ids: ClassVar[list[str]] = []

    async def run(self, ctx: JobContext) -> object:
        """Publish, then return the result."""
        type(self).ids.append(ctx.publish("reports.ready", b"raw bytes"))
        return {"ok": True}


class NoComplete(ReportJob):
    """Forgets ``tx.complete``: the block raises and nothing is written."""

    topic = "reports.requested"

    async def run(self, ctx: JobContext) -> object:
        """Insert, publish, and leave the block without naming a result."""
        async with ctx.transaction() as tx:
            await tx.execute(INSERT, ("acme", 3))
            tx.publish("reports.ready", "x")
        return None


def headers(row: Any) -> dict[str, bytes]:
    """The headers the relay would send for ``row``, by name."""
    return dict(row.kafka_headers())


def test_row_message_and_completion_commit_together_and_a_redelivery_is_a_duplicate() -> None:
    """One run commits the statement, the message (with its effect headers) and the result.

    The same trigger again is answered ``duplicate`` without running: nothing
    more is committed.
    """
    RowAndMessage.runs = 0
    env = JobEnvironment(RowAndMessage())
    result = env.run_sync(TRIGGER)
    assert (result.outcome, result.completion) == ("completed", "accepted")
    assert result.statements == ((INSERT, ("acme", 3)),)
    (message,) = result.messages
    assert message.message.topic == "reports.ready"
    assert message.message.value == b'{"tenant":"acme"}'
    sent = headers(message)
    assert sent["kind"] == b"ready"
    assert sent["traceparent"] == TRACEPARENT  # the request's trace goes on with the message
    assert sent[FENCE_HEADER] == str(result.fence).encode()
    assert sent[JOB_KEY_HEADER] == message.job_key.encode()
    assert sent[EFFECT_ID_HEADER] == effect_id(message.job_key, message.input_version, 0).encode()
    again = env.run_sync(TRIGGER)
    assert again.outcome == "duplicate"
    assert (again.statements, again.messages, RowAndMessage.runs) == ((), (), 1)


def test_a_takeover_just_before_the_transaction_ends_stale_with_nothing_written() -> None:
    """Another pod claims a higher fence just before the transaction: ``lost (stale)``, nothing."""
    env = JobEnvironment(RowAndMessage())
    result = env.run_sync(TRIGGER, faults=[Superseded()])
    assert (result.outcome, result.reason, result.completion) == ("lost", "stale", "stale")
    assert (result.statements, result.messages) == ((), ())
    assert env.run_sync(TRIGGER).outcome == "busy"  # the other pod holds the lease now


def test_a_takeover_that_completed_the_identity_is_a_duplicate() -> None:
    """The other pod also completed the same identity: ``duplicate``, nothing of this run's."""
    env = JobEnvironment(RowAndMessage())
    result = env.run_sync(TRIGGER, faults=[Superseded(completed=True)])
    assert result.outcome == "duplicate"
    assert (result.statements, result.messages) == ((), ())


def test_ctx_publish_commits_with_the_completion_and_not_when_stale() -> None:
    """A job without rows: its message is written in the completion's transaction, or not at all."""
    PublishOnly.ids.clear()
    env = JobEnvironment(PublishOnly())
    stale = env.run_sync(TRIGGER, faults=[Superseded()])
    assert (stale.outcome, stale.reason, stale.messages) == ("lost", "stale", ())
    fresh = JobEnvironment(PublishOnly())
    result = fresh.run_sync(TRIGGER)
    assert (result.outcome, result.result) == ("completed", {"ok": True})
    (message,) = result.messages
    assert message.message.value == b"raw bytes"
    assert PublishOnly.ids == [message.effect_id, message.effect_id]  # stable per identity


def test_a_block_without_tx_complete_fails_and_writes_nothing() -> None:
    """Leaving the block without naming the result is a ``RuntimeError``: rolled back."""
    result = JobEnvironment(NoComplete()).run_sync(TRIGGER)
    assert result.outcome == "failed"
    assert isinstance(result.error, RuntimeError)
    assert (result.statements, result.messages) == ((), ())


def test_the_transaction_waits_out_a_store_outage_while_the_lease_holds() -> None:
    """Two failed openings are retried with backoff under the lease, then the run commits."""
    result = JobEnvironment(RowAndMessage()).run_sync(
        TRIGGER, faults=[StoreOutage(calls=2, during="complete")]
    )
    assert result.outcome == "completed"
    assert len(result.messages) == 1


def test_a_job_consuming_an_effects_topic_is_keyed_by_effect_id() -> None:
    """A record the relay sent carries its effect id: the default job key, so one run per effect."""
    env = JobEnvironment(PublishOnly())
    effect = b"lw1:0123456789abcdef0123456789abcdef:0"
    record = make_trigger({}, key="acme", headers=[(EFFECT_ID_HEADER, effect)])
    first = env.run_sync(record)
    assert (first.job_key, first.outcome) == (effect.decode(), "completed")
    assert env.run_sync(record).outcome == "duplicate"
    other = make_trigger({}, key="acme", headers=[(EFFECT_ID_HEADER, effect[:-1] + b"1")])
    assert env.run_sync(other).outcome == "completed"  # the next effect of the same key


class SwallowsTheFailure(ReportJob):
    """Catches its transaction's failure and returns: completed as if it had none."""

    topic = "reports.requested"

    async def run(self, ctx: JobContext) -> object:
        """Publish in a transaction that fails, catch it, return a result."""
        with contextlib.suppress(ValueError):
            async with ctx.transaction() as tx:
                tx.publish("reports.ready", "dropped with the rollback")
                _fail()
        return {"fallback": True}


def _fail() -> None:
    raise ValueError("the job's own bug")


def test_a_failed_transaction_the_job_catches_commits_none_of_its_messages() -> None:
    """The rolled-back block's message is dropped; ``run()``'s return value is the completion."""
    env = JobEnvironment(SwallowsTheFailure())
    result = env.run_sync(TRIGGER)
    assert (result.outcome, result.completion, result.messages) == ("completed", "accepted", ())


def test_effect_ids_and_stored_headers_keep_their_format() -> None:
    """The effect id is sha256 over ``json.dumps([key, version])``; headers round-trip bytes."""
    for key, version in [("report:acme", "v1"), ('ké\u2028"\\\x00y', "\ud7ff/\U0001f600")]:
        digest = hashlib.sha256(json.dumps([key, version]).encode()).hexdigest()
        assert effect_id(key, version, 7) == f"lw1:{digest[:32]}:7"
    headers = (("traceparent", TRACEPARENT), ("raw", bytes(range(256))), ("empty", b""))
    assert decode_headers(encode_headers(headers)) == headers
    assert decode_headers(json.dumps([["x", base64.b64encode(b"\xff").decode()]])) == (
        ("x", b"\xff"),
    )


def test_an_outbox_row_read_from_its_columns_equals_the_constructed_one() -> None:
    """``outbox_row`` fills the frozen objects slot by slot: every field, as ``__init__`` would."""
    headers = (("raw", b"\x00\xff"),)
    trace = (("traceparent", TRACEPARENT),)
    stored = effect_id("job", "v1", 2)
    for key, head, traced, effect in ((b"k", headers, trace, stored), (None, (), (), None)):
        columns = (7, "job", "v1", 2, 5, "t", key, b"value", encode_headers(head))
        row = outbox_row((*columns, encode_headers(traced), effect))
        message = Message(topic="t", value=b"value", key=key, headers=head, trace=traced)
        built = OutboxRow(
            id=7,
            job_key="job",
            input_version="v1",
            seq=2,
            fence=5,
            message=message,
            stored_effect_id=effect,
        )
        assert row == built
        assert repr(row) == repr(built)
        assert hash(row) == hash(built)
        assert row.stored_effect_id == built.stored_effect_id == effect
        assert row.effect_id == built.effect_id == stored  # stored or computed: the same
