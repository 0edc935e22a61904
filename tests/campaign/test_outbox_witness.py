"""The campaign's view of a real store's outbox: its rows, the reclaim audit, lapsing claims.

On PostgreSQL and a SQLite file: a committed message read back with its
times; a relay's claim lapsed by the ``outbox_claims_lapse`` fault so another
relay takes it over; and Spring Modulith's #1935 planted in the database (a
claim taken on a row already marked sent, as a claim query that forgot
``sent_at`` would) caught by the audit and failed by the checker: by the
campaign's trigger on its own store, by the columns on one of ``--store-url``;
on PostgreSQL, whose claims are row locks that write no column, by its send.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import time
from collections.abc import Callable

import anyio
import psycopg
import pytest

from leaseworker import CompletionRequest, CompletionStore, open_store
from leaseworker._kafka import KafkaSender
from leaseworker._store import Message, effect_store
from leaseworker_dev._campaign import check
from leaseworker_dev._campaign._campaign_records import Delivery
from leaseworker_dev._campaign._outbox_audit import (
    install_audit,
    lapse_claims,
    outbox_rows,
    reclaims,
)
from leaseworker_dev._services import LocalKafka

from ..kafka_util import KafkaNames, read_topic
from .test_checker import CLEAN, RECORDS

NAMESPACE = "chaos-1"
STORE_KEY = f"{NAMESPACE}:{{report:acme:2026-11}}"


async def _commit(store: CompletionStore, topic: str = "reports.ready") -> None:
    effects = effect_store(store)
    async with effects.transaction(STORE_KEY, "v1", 11) as tx:
        request = CompletionRequest(
            job_key=STORE_KEY,
            input_version="v1",
            fence=11,
            result=None,
            execution_id="b",
            pod="pod-b",
        )
        await tx.commit(request, [Message.build(topic, b"ready")])


def _reclaim_sent_rows(store_url: str) -> None:
    """What a claim query without ``sent_at IS NULL`` does once a sent row's claim expired."""
    if store_url.startswith("sqlite:///"):
        with sqlite3.connect(store_url.removeprefix("sqlite:///")) as conn:
            until = time.time_ns() // 1000 + 30_000_000
            conn.execute(
                "UPDATE leaseworker_outbox SET claimed_by = 'buggy', claimed_until = ?", (until,)
            )
        return
    with psycopg.connect(store_url) as conn:
        conn.execute(
            "UPDATE leaseworker_outbox SET claimed_by = 'buggy', claimed_until = now() + '30 s'"
        )


@pytest.mark.parametrize("audited", [True, False], ids=["trigger", "columns"])
async def test_the_outbox_is_read_a_lapsed_claim_taken_over_and_a_reclaim_caught(
    store_url: str, store: CompletionStore, audited: bool
) -> None:
    """Rows and times as the checker needs them; the lapse frees a claim; the audit sees #1935."""
    if audited:
        await install_audit(store_url)
    await _commit(store)
    [row] = await outbox_rows(store_url, NAMESPACE)
    assert (row.job_key, row.input_version, row.fence, row.sent) == (
        "report:acme:2026-11",
        "v1",
        11,
        None,
    )
    assert abs(row.committed - time.time()) < 60
    assert await outbox_rows(store_url, "another-campaign") == ()
    [claimed] = await effect_store(store).claim_outbox("pod-1:a", limit=10, hold=30.0)
    async with open_store(store_url) as other:  # pod 2's process, its own store
        pod_2 = effect_store(other)
        assert await pod_2.claim_outbox("pod-2:b", limit=10, hold=30.0) == []  # held by pod 1
        assert await lapse_claims(store_url, 0.01) == 1
        [taken] = await pod_2.claim_outbox("pod-2:b", limit=10, hold=30.0)
        assert taken.effect_id == claimed.effect_id == row.effect_id
        assert await pod_2.mark_sent("pod-2:b", [taken.id]) == 1
    [sent] = await outbox_rows(store_url, NAMESPACE)
    assert sent.sent is not None
    assert sent.sent >= row.committed
    # the relays' own claims, a lapsed one included: none on a sent row
    assert await reclaims(store_url, NAMESPACE, audited=audited) == ()
    await anyio.sleep(0.01)  # the planted claim comes 10 ms after the mark at least
    _reclaim_sent_rows(store_url)
    [caught] = await reclaims(store_url, NAMESPACE, audited=audited)
    assert (caught.effect_id, caught.relay) == (row.effect_id, "buggy")
    records = dataclasses.replace(RECORDS, outbox=(sent,), reclaims=(caught,))
    [failed] = [v for v in check(CLEAN, records) if v.name == "no sent message claimed again"]
    assert not failed.passed


async def test_on_postgresql_a_sent_row_locked_and_sent_again_fails_by_its_send(
    store_url_for: Callable[[str], str], kafka_server: LocalKafka, kafka_names: KafkaNames
) -> None:
    """#1935 with row-lock claims: the lock writes nothing, the audit sees none; its send shows it.

    A relay claims, sends and marks the message; then a claim that forgot
    ``sent_at IS NULL`` locks the sent row and sends it again. The store's
    audit (its trigger) finds no claim; the checker fails on the second record,
    created after the mark with no claim lapsed. The first record alone passes.
    """
    url = store_url_for("postgresql")
    await install_audit(url)
    topic = f"{kafka_names.topic}-reclaimed"
    kafka_server.create_topics([topic])
    sender = KafkaSender(kafka_server.bootstrap_servers)
    try:
        async with open_store(url) as opened:
            await _commit(opened, topic)
            effects = effect_store(opened)
            [claimed] = await effects.claim_outbox("pod-1:a", limit=10, hold=30.0)
            [acked] = await sender.send_batch([claimed])
            assert not isinstance(acked, Exception)
            assert await effects.mark_sent("pod-1:a", [claimed.id]) == 1
        with psycopg.connect(url) as conn:  # the buggy claim: row locks, no column written
            assert conn.execute("SELECT id FROM leaseworker_outbox FOR UPDATE").fetchall()
            [again] = await sender.send_batch([claimed])
            assert not isinstance(again, Exception)
    finally:
        await sender.aclose()
    assert await reclaims(url, NAMESPACE) == ()  # the audit cannot see a lock
    [row] = await outbox_rows(url, NAMESPACE)
    deliveries = tuple(
        Delivery(
            effect_id=row.effect_id,
            fence=11,
            status="new" if record.offset == 0 else "duplicate",
            topic=topic,
            partition=record.partition,
            offset=record.offset,
            created=record.timestamp / 1000,
            received=time.time(),
        )
        for record in await read_topic(kafka_server.bootstrap_servers, topic, 2)
    )
    records = dataclasses.replace(
        RECORDS, outbox=(row,), deliveries=deliveries, processed={row.effect_id: 1}
    )
    verdicts = {v.name: v for v in check(CLEAN, records)}
    failed = verdicts["no sent message claimed again"]
    assert not failed.passed
    assert "after it was marked sent, no claim lapsed" in failed.violations[0]
    first = dataclasses.replace(records, deliveries=deliveries[:1])
    assert {v.name: v for v in check(CLEAN, first)}["no sent message claimed again"].passed
