"""Effects with real ``leaseworker run`` pods, a real PostgreSQL store and a real broker.

A paused pod: A's job waits before its transaction; the test SIGSTOPs A and,
meanwhile, Redis loses A's lease (the key is deleted, as a failover to a
replica that never had it would), so B takes the job key over and commits its
row and message. A, resumed well inside its own lease, opens its transaction
late: nothing on A's side has noticed the loss (a pause past the lease would
be noticed at A's first await: ``lost``, ``loop_blocked``), so only the head
lock's fence check stands between A and the table, and it refuses: nothing
of A's is written, A ends ``lost (stale)``. A killed pod: A's job commits its
row and message and SIGKILLs its own pod before the relay could send it; B's
relay sends it, B answers the redelivered trigger ``duplicate``, and a
receiver's inbox processes the effect once. Each test takes about 20 s.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition  # type: ignore[import-untyped]
from redis.asyncio import Redis

from leaseworker import JobContext, RedisLeases, ReportJob
from leaseworker.effects import Effect, PostgresInbox, TransactionRefused
from leaseworker_dev._services import LocalKafka, LocalPostgres, LocalRedis, PodProcess

from ..kafka_util import committed, produce
from ..pods import ready, spawn
from ..waiting import eventually

LEASE = 2.0
LONG_LEASE = "60"
"""A's lease in the paused test: its next renewal is 20 s away, the test is over by then."""
TABLE = "CREATE TABLE report_rows (pod text NOT NULL, fence bigint NOT NULL, version text)"


class EffectJob(ReportJob):
    """Writes a row and publishes a message in ``ctx.transaction()``; marks what happened.

    Payload ``wait_for``: after the last checkpoint, wait until that file
    exists. ``kill``: SIGKILL its own pod as soon as the transaction
    committed, before the relay sends. ``$LW_TEST_LEASE``: the lease (s).
    Markers (``$LW_TEST_MARKERS``): ``start <pod> <fence>``, ``committed <pod>
    <fence> <status>``, ``refused <pod> <fence> <status>``.
    """

    topic = os.environ.get("LW_TEST_TOPIC", "unset")
    lease_duration = float(os.environ.get("LW_TEST_LEASE", LEASE))

    async def run(self, ctx: JobContext) -> object:
        """Mark the start, maybe block, then the transaction: one row, one message, the result."""
        _mark(f"start {ctx.pod} {ctx.fence}")
        await ctx.checkpoint()
        wait_for = ctx.trigger.payload.get("wait_for")
        if isinstance(wait_for, str):
            # Another process creates the file: no in-process event can say so.
            while not os.path.exists(wait_for):  # noqa: ASYNC240, ASYNC110
                await anyio.sleep(0.02)
        version = str(ctx.trigger.payload.get("inputVersion"))
        try:
            async with ctx.transaction() as tx:
                await tx.execute(
                    "INSERT INTO report_rows (pod, fence, version) VALUES (%s, %s, %s)",
                    (ctx.pod, ctx.fence, version),
                )
                tx.publish(os.environ["LW_TEST_EFFECTS"], {"pod": ctx.pod}, key=ctx.job_key)
                tx.complete({"pod": ctx.pod, "fence": ctx.fence})
        except TransactionRefused as refused:
            _mark(f"refused {ctx.pod} {ctx.fence} {refused.status}")
            raise
        assert tx.answer is not None
        _mark(f"committed {ctx.pod} {ctx.fence} {tx.answer.status}")
        if ctx.trigger.payload.get("kill"):
            os.kill(os.getpid(), signal.SIGKILL)  # between the commit and the relay's send
        return None


def _mark(line: str) -> None:
    with open(os.environ["LW_TEST_MARKERS"], "a") as markers:
        markers.write(line + "\n")


class Pods:
    """Pods of :class:`EffectJob` sharing Redis, the store and the effects topic."""

    def __init__(self, kafka: LocalKafka, redis_url: str, store_url: str, workdir: Path) -> None:
        suffix = uuid.uuid4().hex[:10]
        self.suffix, self.kafka, self.workdir = suffix, kafka, workdir
        self.namespace, self.key = f"t{suffix}", "report:acme:2026-11"
        self.effects = f"effects-{suffix}"
        kafka.create_topics([self.effects])
        self.common = [
            *("--bootstrap-servers", kafka.bootstrap_servers, "--redis-url", redis_url),
            *("--namespace", self.namespace, "--store-url", store_url),
        ]
        self.started: list[PodProcess] = []

    def topic(self, name: str) -> str:
        """The trigger topic called ``name`` (its group is ``g-<topic>``)."""
        return f"fx-{name}-{self.suffix}"

    async def spawn(
        self, name: str, topic: str, *extra: str, idle: bool = False, lease: str = str(LEASE)
    ) -> PodProcess:
        """Start pod ``name`` on ``topic``; wait until it holds a partition (``idle``: none)."""
        self.kafka.create_topics([self.topic(topic)], exist_ok=True)
        env = {
            "LW_TEST_LEASE": lease,
            "LW_TEST_TOPIC": self.topic(topic),
            "LW_TEST_MARKERS": str(self.workdir / "markers.txt"),
            "LW_TEST_EFFECTS": self.effects,
        }
        argv = [*self.common, "--pod", name, "--group", f"g-{self.topic(topic)}", *extra]
        pod = spawn(name, f"{__name__}:EffectJob", self.workdir, env, *argv, evidence=True)
        self.started.append(pod)

        async def joined() -> bool:
            return await ready(pod, idle=idle)

        await eventually(joined, within=45)
        return pod

    async def send(self, topic: str, **payload: Any) -> None:
        """Produce one request for the job key on ``topic``."""
        value = json.dumps(payload).encode()
        await produce(self.kafka.bootstrap_servers, self.topic(topic), [(self.key.encode(), value)])

    def marks(self, what: str, pod: str) -> list[list[str]]:
        """The marker lines ``<what> <pod> ...``, without those two words."""
        path = self.workdir / "markers.txt"
        lines = path.read_text().splitlines() if path.exists() else []
        return [line.split()[2:] for line in lines if line.split()[:2] == [what, pod]]

    async def until(self, what: str, pod: str, within: float = 20) -> list[list[str]]:
        """Wait for a ``<what> <pod>`` marker; return them all."""

        async def marked() -> bool:
            return bool(self.marks(what, pod))

        await eventually(marked, within=within)
        return self.marks(what, pod)

    async def close(self) -> None:
        """Resume, stop and reap every pod started."""
        for pod in self.started:
            pod.signal(signal.SIGCONT)  # a stopped process cannot handle SIGTERM
            pod.signal(signal.SIGTERM)
        with anyio.move_on_after(20):
            for pod in self.started:
                if pod.running():
                    await pod.wait_exit(20)
        for pod in self.started:
            pod.kill()


@pytest.fixture
def pg_url(postgres_server: LocalPostgres) -> str:
    """A fresh PostgreSQL database holding the job's own table."""
    url = postgres_server.create_database(f"t{uuid.uuid4().hex[:12]}")
    with psycopg.connect(url) as conn:
        conn.execute(TABLE)
    return url


@pytest.fixture
async def pods(
    kafka_server: LocalKafka, redis_server: LocalRedis, pg_url: str, tmp_path: Path
) -> AsyncIterator[Pods]:
    """:class:`Pods` on the session's Kafka and Redis and this test's PostgreSQL database."""
    opened = Pods(kafka_server, redis_server.url, pg_url, tmp_path)
    try:
        yield opened
    finally:
        await opened.close()


def _query(url: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql).fetchall()


@pytest.mark.timeout(120)
async def test_a_paused_pods_late_transaction_writes_nothing_and_ends_stale(
    pods: Pods, redis: Redis, pg_url: str
) -> None:
    """Invariant 11: A's row and message are never written; B's are; A is lost (stale)."""
    go = pods.workdir / "go"
    a = await pods.spawn("pod-a", "a", "--session-timeout", "30", lease=LONG_LEASE)
    await pods.spawn("pod-b", "b")
    await pods.send("a", inputVersion="request-a", wait_for=str(go))
    [[fence_a]] = await pods.until("start", "pod-a")
    a.signal(signal.SIGSTOP)
    await redis.delete(RedisLeases(redis, namespace=pods.namespace).lease_key(pods.key))
    await pods.send("b", inputVersion="request-b")
    [[fence_b, status_b]] = await pods.until("committed", "pod-b")
    assert (status_b, int(fence_b) > int(fence_a)) == ("accepted", True)
    go.touch()
    a.signal(signal.SIGCONT)

    async def a_answered() -> bool:
        return bool(pods.marks("refused", "pod-a") or pods.marks("committed", "pod-a"))

    await eventually(a_answered, within=20)
    assert _query(pg_url, "SELECT pod, fence, version FROM report_rows") == [
        ("pod-b", int(fence_b), "request-b")
    ]
    outbox = _query(pg_url, "SELECT job_key, input_version, fence FROM leaseworker_outbox")
    assert outbox == [(f"{pods.namespace}:{{{pods.key}}}", "request-b", int(fence_b))]
    assert pods.marks("refused", "pod-a") == [[fence_a, "stale"]]
    assert pods.marks("committed", "pod-a") == []

    async def a_reported() -> bool:
        return "lost (stale)" in a.log_text()

    await eventually(a_reported, within=10)


async def _effects_topic(bootstrap: str, topic: str) -> list[Any]:
    """Every record on partition 0 of ``topic`` so far."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    found: list[Any] = []
    with anyio.fail_after(20):
        await consumer.start()
        try:
            partition = TopicPartition(topic, 0)
            consumer.assign([partition])
            await consumer.seek_to_beginning(partition)
            end = (await consumer.end_offsets([partition]))[partition]
            while await consumer.position(partition) < end:
                batch = await consumer.getmany(partition, timeout_ms=500)
                found += batch.get(partition, [])
        finally:
            await consumer.stop()
    return found


@pytest.mark.timeout(120)
async def test_a_pod_killed_between_commit_and_send_has_its_message_sent_by_another(
    pods: Pods, pg_url: str
) -> None:
    """B's relay sends A's committed message; the receiver's effect happens once.

    A and B share the trigger's group: B gets A's partition after A's session
    times out, and the redelivered trigger is answered ``duplicate`` (no
    second row, no second message). A claim A's relay took before dying would
    expire after its 30 s hold: the waits allow for it.
    """
    fast = ("--session-timeout", "3", "--heartbeat-interval", "1")
    a = await pods.spawn("pod-a", "shared", *fast)
    b = await pods.spawn("pod-b", "shared", *fast, idle=True)
    await pods.send("shared", inputVersion="request-a", kill=True)
    [[fence_a, status]] = await pods.until("committed", "pod-a")
    assert status == "accepted"
    assert await a.wait_exit(10) == -signal.SIGKILL

    async def sent_by_b() -> bool:
        rows = _query(
            pg_url, "SELECT sent_by FROM leaseworker_outbox_state WHERE sent_at IS NOT NULL"
        )
        return bool(rows) and str(rows[0][0]).startswith("pod-b:")

    await eventually(sent_by_b, within=45)
    group, topic = f"g-{pods.topic('shared')}", pods.topic("shared")

    async def duplicate_committed() -> bool:
        return await committed(pods.kafka.bootstrap_servers, group, topic) == {0: 1}

    await eventually(duplicate_committed, within=30)
    assert pods.marks("start", "pod-b") == []  # answered from the store, not run again
    assert "duplicate" in b.log_text()
    records = await _effects_topic(pods.kafka.bootstrap_servers, pods.effects)
    assert records  # at least once; the inbox makes it once
    inbox = PostgresInbox("billing")
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await inbox.setup(conn)
        await conn.execute("CREATE TABLE billed (effect_id text NOT NULL, fence bigint)")
        for record in records:
            effect = Effect.from_headers(record.headers)
            assert effect is not None
            async with conn.transaction():
                if await inbox.accept(conn, effect) == "new":
                    await conn.execute(
                        "INSERT INTO billed VALUES (%s, %s)", (effect.effect_id, effect.fence)
                    )
        billed = await (await conn.execute("SELECT fence FROM billed")).fetchall()
    assert billed == [(int(fence_a),)]
    assert _query(pg_url, "SELECT pod FROM report_rows") == [("pod-a",)]
