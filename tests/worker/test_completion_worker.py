"""The worker with the fenced completion store: duplicates, new inputs, a store outage.

In-process pods against the session's real Kafka and Redis, and a real store
on each backend in turn (PostgreSQL and SQLite, the ``store_url`` fixture).
Store outages are real conditions: for PostgreSQL a ChaosProxy that refuses
and cuts the connections, for SQLite the file's write lock held by another
connection.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

import pytest
from redis.asyncio import Redis

from leaseworker import CompletionStore, Event, ExecutionEvent, RedisLeases, open_store
from leaseworker._execution import completion_key
from leaseworker.testing import ChaosProxy
from leaseworker_dev._services import LocalKafka, LocalPostgres, LocalRedis

from ..jobs import GateJob, Recorder, on_topic
from ..kafka_util import KafkaNames, committed, payload, produce
from ..waiting import eventually
from ..worker_util import make_worker, pod_config, running, until


@dataclass
class Events:
    """Every execution event of a pod, in order (an ExecutionObserver)."""

    seen: list[ExecutionEvent] = field(default_factory=list)

    def __call__(self, event: Event) -> None:
        """Keep the event."""
        if not isinstance(event, ExecutionEvent) or event.event == "acquiring":
            return
        self.seen.append(event)

    def retried(self, key: str) -> bool:
        """Whether the executor scheduled another execution of ``key``'s trigger."""
        return any(e.event == "retry" and e.job_key == key for e in self.seen)

    def finished(self, key: str) -> list[tuple[str | None, str | None]]:
        """(outcome, reason) of every finished execution of ``key``."""
        return [
            (e.outcome, e.reason) for e in self.seen if e.event == "finished" and e.job_key == key
        ]


async def test_a_redelivered_trigger_is_answered_duplicate_without_running(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    topic: str,
    store: CompletionStore,
) -> None:
    """Invariant 6: a record delivered again after it completed is not recomputed.

    Pod A runs and commits the trigger; pod B then gets the same record again
    (a restart whose commit was lost: a consumer group with no committed
    offset), shares the store and namespace, and answers ``duplicate`` without
    calling ``run``; it commits the record all the same.
    """
    recorder = Recorder()
    job = on_topic(GateJob, topic)(recorder)
    bootstrap = kafka_server.bootstrap_servers
    await produce(bootstrap, topic, [(b"report-1", payload(period="2026-11"))])
    config_a = pod_config(kafka_server, redis_server, kafka_names, namespace)
    async with running(make_worker(job, config_a, store=store)):
        await recorder.until(lambda: recorder.done("report-1") == 1)

        async def a_committed() -> bool:
            return await committed(bootstrap, kafka_names.group, topic) == {0: 1}

        await eventually(a_committed, within=10)
    group_b = f"{kafka_names.group}-restarted"
    config_b = pod_config(
        kafka_server, redis_server, kafka_names, namespace, group=group_b, pod="pod-b"
    )
    events = Events()
    async with running(make_worker(job, config_b, store=store, hooks=[events])):

        async def b_committed() -> bool:
            return await committed(bootstrap, group_b, topic) == {0: 1}

        await eventually(b_committed, within=15)
    assert len(recorder.runs_of("report-1")) == 1  # run() was called once, by pod A
    assert events.finished("report-1") == [("duplicate", None)]
    assert not any(e.event == "started" for e in events.seen)  # no lease was even taken
    state = await store.state(completion_key(namespace, "report-1"))
    assert state is not None
    assert state.pod == "pod-a"
    assert state.result == {"key": "report-1"}


async def test_identity_tells_a_retry_from_a_new_report_with_new_inputs(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    topic: str,
    store: CompletionStore,
) -> None:
    """Same job key: the same input version again is a duplicate, a new one a new completion.

    Explicit ``inputVersion`` v1, v1 again (a retry by the producer), v2 (an
    intentional new report), then two identical payloads without a version
    (the default hashes the payload) and one with different inputs.
    """
    recorder = Recorder()
    job = on_topic(GateJob, topic)(recorder)
    records = [
        (b"acme", payload(inputVersion="v1", note="first")),
        (b"acme", payload(inputVersion="v1", note="retried")),  # only the version counts
        (b"acme", payload(inputVersion="v2")),
        (b"beta", payload(rows=10)),
        (b"beta", payload(rows=10)),
        (b"beta", payload(rows=20)),
    ]
    await produce(kafka_server.bootstrap_servers, topic, records)
    events = Events()
    config = pod_config(kafka_server, redis_server, kafka_names, namespace)
    async with running(make_worker(job, config, store=store, hooks=[events])):

        async def all_committed() -> bool:
            found = await committed(kafka_server.bootstrap_servers, kafka_names.group, topic)
            return found == {0: len(records)}

        await eventually(all_committed, within=20)
    completed, duplicate = ("completed", None), ("duplicate", None)
    assert events.finished("acme") == [completed, duplicate, completed]
    assert events.finished("beta") == [completed, duplicate, completed]
    assert len(recorder.runs_of("acme")) == len(recorder.runs_of("beta")) == 2
    acme = completion_key(namespace, "acme")
    state = await store.state(acme)
    assert state is not None
    assert state.input_version == "v2"
    assert await store.lookup(acme, "v1") is not None  # the first report is still recorded


@contextlib.asynccontextmanager
async def store_with_outage(
    store_url: str, postgres_server: LocalPostgres | None
) -> AsyncIterator[tuple[CompletionStore, Callable[[], contextlib.AbstractContextManager[None]]]]:
    """The worker's store on ``store_url`` (short timeout) and outages: ``with outage(): ...``.

    PostgreSQL: the store talks through a ChaosProxy; down = refuse new
    connections and cut the open ones. SQLite: down = another connection
    holds the file's write lock (``BEGIN IMMEDIATE``); readers still read.
    """
    if postgres_server is None:
        async with open_store(store_url, call_timeout=0.5) as store:
            path = store_url.removeprefix("sqlite:///")
            yield store, lambda: _sqlite_locked(path)
        return
    async with ChaosProxy(postgres_server.port) as proxy:
        via = store_url.replace(f":{postgres_server.port}/", f":{proxy.port}/")
        async with open_store(via, call_timeout=0.5) as store:
            yield store, lambda: _proxy_down(proxy)


@contextlib.contextmanager
def _sqlite_locked(path: str) -> Iterator[None]:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
        conn.execute("ROLLBACK")
    finally:
        conn.close()


@contextlib.contextmanager
def _proxy_down(proxy: ChaosProxy) -> Iterator[None]:
    proxy.refuse = True
    proxy.cut()
    try:
        yield
    finally:
        proxy.refuse = False


def _retries(caplog: pytest.LogCaptureFixture) -> int:
    return sum(getattr(r, "event", None) == "completion_retry" for r in caplog.records)


async def test_store_outage_at_completion_retries_under_the_lease_or_ends_lost_uncommitted(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    topic: str,
    store_url: str,
    store: CompletionStore,
    leases: RedisLeases,
    redis: Redis,
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Store down when the job finishes: the completion is retried while the lease holds.

    First trigger: the outage ends while the lease still holds; the retried
    completion lands, the outcome is ``completed``, the record is committed.
    Second trigger: the lease is lost (its key deleted) while the store is
    still down: the outcome is ``lost``, nothing is committed and nothing is
    stored (the test reads the store directly). Once the store is back, the
    trigger's next execution completes it and only then is it committed.
    """
    caplog.set_level(logging.INFO, logger="leaseworker")
    postgres = (
        None if store_url.startswith("sqlite") else request.getfixturevalue("postgres_server")
    )
    recorder = Recorder()
    job = on_topic(GateJob, topic)(recorder)
    bootstrap = kafka_server.bootstrap_servers
    events = Events()
    config = pod_config(kafka_server, redis_server, kafka_names, namespace)

    async def committed_up_to() -> dict[int, int]:
        return await committed(bootstrap, kafka_names.group, topic)

    async with (
        store_with_outage(store_url, postgres) as (worker_store, outage),
        running(make_worker(job, config, store=worker_store, hooks=[events])) as worker,
    ):
        # 1. The outage ends while the lease holds.
        await produce(bootstrap, topic, [(b"one", payload(gate=True))])
        await recorder.until(lambda: len(recorder.runs_of("one")) == 1)
        with outage():
            recorder.gate("one").set()
            await until(lambda: _retries(caplog) >= 2, within=10)
        await until(lambda: events.finished("one") == [("completed", None)], within=10)

        async def first_committed() -> bool:
            return await committed_up_to() == {0: 1}

        await eventually(first_committed, within=10)
        # 2. The lease is lost while the store is still down.
        await produce(bootstrap, topic, [(b"two", payload(gate=True))])
        await recorder.until(lambda: len(recorder.runs_of("two")) == 1)
        with outage():
            before = _retries(caplog)
            recorder.gate("two").set()
            await until(lambda: _retries(caplog) > before, within=10)
            await redis.delete(leases.lease_key("two"))
            await until(lambda: ("lost", "rejected") in events.finished("two"), within=10)
            # The executor chose to run "two" again: its record is still in flight, so
            # nothing could have marked its offset done.
            await until(lambda: events.retried("two"), within=10)
            assert worker.stats.finished == 1  # "one" only
            assert await committed_up_to() == {0: 1}  # "two" is not committed
            assert await store.state(completion_key(namespace, "two")) is None  # nothing written
        # The store is back: the trigger's next execution completes it.
        await until(lambda: ("completed", None) in events.finished("two"), within=20)

        async def second_committed() -> bool:
            return await committed_up_to() == {0: 2}

        await eventually(second_committed, within=10)
    assert recorder.done("one") == 1
    assert len(recorder.runs_of("two")) == 2  # the lost execution's work was redone once
    state = await store.state(completion_key(namespace, "two"))
    assert state is not None
    assert state.execution_id == recorder.runs_of("two")[1].execution_id
