"""What ``leaseworker inspect`` and the outbox gauges read, on every backend.

``outbox_entries`` gives each message's commit time, send time and claims
(``attempts``: a released or expired claim counts); ``outbox_backlog`` the
unsent count and the oldest unsent message's age.
"""

from __future__ import annotations

from datetime import UTC, datetime

from leaseworker._store import EffectStore, Message

from .test_store_effects import any_store, request, write

__all__ = ["any_store"]


async def test_entries_say_when_each_message_committed_and_was_sent_and_how_often_claimed(
    any_store: EffectStore,
) -> None:
    """Two messages: one claimed, released, claimed again and sent (by the second relay)."""
    before = datetime.now(UTC).replace(microsecond=0)
    assert await any_store.outbox_backlog() == (0, None)
    await write(any_store, 1, messages=2)
    depth, age = await any_store.outbox_backlog()
    assert depth == 2
    assert age is not None
    assert 0 <= age < 60
    [first] = await any_store.claim_outbox("relay-a", limit=1, hold=30)
    await any_store.release_outbox("relay-a", [first.id])
    [again] = await any_store.claim_outbox("relay-b", limit=1, hold=30)
    assert again.id == first.id
    assert await any_store.mark_sent("relay-b", [again.id]) == 1
    sent, unsent = await any_store.outbox_entries()
    assert (sent.row.id, sent.attempts, sent.sent, sent.sent_by) == (first.id, 2, True, "relay-b")
    assert (unsent.attempts, unsent.sent, unsent.sent_at, unsent.sent_by) == (0, False, None, None)
    assert sent.sent_at is not None
    assert before <= sent.committed_at <= sent.sent_at
    assert sent.committed_at.tzinfo is not None
    depth, age = await any_store.outbox_backlog()
    assert depth == 1
    assert [e.row.id for e in await any_store.outbox_entries(sent.row.job_key)] == [
        sent.row.id,
        unsent.row.id,
    ]
    assert await any_store.outbox_entries("another:{key}") == []


async def test_the_backlog_counts_only_the_job_keys_of_the_prefix_given(
    any_store: EffectStore,
) -> None:
    """Namespaces ``ns`` and ``ns:x`` share the store: each prefix counts its own rows only."""
    for key, messages in (("ns:{r}", 2), ("ns:x:{r}", 3)):
        async with any_store.transaction(key, "v1", 1) as tx:
            sent = [Message.build("reports.ready", {"n": n}) for n in range(messages)]
            await tx.commit(request(1, key=key), sent)
    assert (await any_store.outbox_backlog("ns:{"))[0] == 2
    assert (await any_store.outbox_backlog("ns:x:{"))[0] == 3
    assert (await any_store.outbox_backlog("other:{"))[0] == 0
    assert (await any_store.outbox_backlog())[0] == 5
