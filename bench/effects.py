"""Effects benches: the outbox relay, commit-to-receiver latency, a pod writing a row and a message.

Three parts (``--parts``), each against one private Kafka broker (and Redis
and PostgreSQL), in paired rounds of alternating order; ratios are taken
within a round, so both sides share whatever else the machine was doing:

- ``relay``: the outbox relay (:class:`~leaseworker.effects.Relay` with the
  pod's :class:`KafkaSender`) draining ``--messages`` committed outbox rows,
  one job key each, against a bare aiokafka idempotent producer (``acks=all``)
  sending the same messages (topic, key, value, headers), all at once, then
  awaiting every acknowledgement. Both producers are connected before timing.
  Each side also reports the CPU it cost per 1,000 rows: this process and
  every service process under it (PostgreSQL's backends, Kafka), from /proc.
- ``latency``: an in-process pod whose job writes one row and publishes one
  message in ``ctx.transaction()``; a consumer of the messages' topic takes
  the time from the block's end (committed) to the record's arrival. Idle:
  one trigger at a time, ``--idle-gap`` apart; under load: ``--messages``
  triggers produced at once.
- ``pod``: that pod's throughput against a fair baseline, the bare loop of
  bench/throughput.py (Redis lock per record, offsets committed per poll)
  doing the same by hand: one transaction inserting the row and upserting
  identity, fence and result, then the message sent (``acks=all``,
  idempotent) and its acknowledgement awaited before the offset commit. The
  pod's side ends when every offset is committed and every message is on its
  topic.

    .venv/bin/python bench/effects.py [--parts relay,latency,pod] [--messages 5000]
        [--rounds 5] [--stores postgresql,sqlite] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, cast

import anyio
import psycopg
from aiokafka import (  # type: ignore[import-untyped]
    AIOKafkaConsumer,
    AIOKafkaProducer,
    TopicPartition,
)
from redis.asyncio import Redis
from throughput import (
    PARTITIONS,
    FirstStart,
    PostgresWrites,
    SqliteBatch,
    _input_version,
    _run_worker,
    bare_loop,
    produce,
    run_rounds,
    wait_committed,
)

from leaseworker import CompletionRequest, JobContext, Pod, PodConfig, ReportJob, open_store
from leaseworker._kafka import KafkaSender
from leaseworker._store._effect_rows import EffectStore, Message, OutboxRow, effect_id, effect_store
from leaseworker.effects import Relay
from leaseworker_dev._services._kafka import LocalKafka
from leaseworker_dev._services._local_stack import LocalStack

COMMITTED: dict[str, float] = {}
"""Effect id -> when its transaction's block ended (``perf_counter``), filled by the job."""

ROWS_SQL = {
    "postgresql": "CREATE TABLE IF NOT EXISTS bench_rows (job_key text, n bigint, at float8)",
    "sqlite": "CREATE TABLE IF NOT EXISTS bench_rows (job_key TEXT, n INTEGER, at REAL)",
}
INSERT_ROW = {
    "postgresql": "INSERT INTO bench_rows (job_key, n, at) VALUES (%s, %s, %s)",
    "sqlite": "INSERT INTO bench_rows (job_key, n, at) VALUES (?, ?, ?)",
}


class RowAndMessage(ReportJob):
    """One row and one message per trigger, in the completion's transaction."""

    topic = "unset"
    out = "unset"
    insert = INSERT_ROW["postgresql"]

    async def run(self, ctx: JobContext) -> object:
        """Insert the row, publish the message, complete; note when it committed."""
        async with ctx.transaction() as tx:
            await tx.execute(self.insert, (ctx.job_key, 1, time.time()))
            effect = tx.publish(self.out, b'{"n": 1}', key=ctx.job_key)
            tx.complete(None)
        COMMITTED[effect] = time.perf_counter()
        return None


def _kind(url: str) -> str:
    return "sqlite" if url.startswith("sqlite") else "postgresql"


async def _create_rows_table(url: str) -> None:
    """Create the job's own table in the store's database."""
    if _kind(url) == "postgresql":
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute(ROWS_SQL["postgresql"])
    else:
        import sqlite3

        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn:
            conn.execute(ROWS_SQL["sqlite"])
            conn.commit()


# --- relay vs bare producer ---------------------------------------------------------------


async def fill_outbox(store: EffectStore, topic: str, count: int, tag: str) -> list[OutboxRow]:
    """Commit ``count`` executions of distinct job keys with one message each (16 at a time).

    Return the rows as a claim would give them (ids aside), checked against
    the store's for the first key: reading the whole outbox back took longer
    than the store's timeout once it held 100,000 rows.
    """
    limiter = anyio.Semaphore(16)
    rows: list[OutboxRow] = []

    async def one(n: int) -> None:
        key = f"{tag}:{n}"
        message = Message.build(topic, b'{"n": 1}', key=key)
        async with limiter, store.transaction(key, "v1", 1) as tx:
            request = CompletionRequest(
                job_key=key, input_version="v1", fence=1, result=None, execution_id=key, pod="b"
            )
            await tx.commit(request, [message])
        stored = effect_id(key, "v1", 0)  # as a claim reads it: not hashed in the bare side's time
        rows.append(
            OutboxRow(
                id=n,
                job_key=key,
                input_version="v1",
                seq=0,
                fence=1,
                message=message,
                stored_effect_id=stored,
            )
        )

    async with anyio.create_task_group() as tg:
        for n in range(count):
            tg.start_soon(one, n)
    rows.sort(key=lambda row: row.id)
    [(first, _)] = await store.outbox(rows[0].job_key)
    if first.kafka_headers() != rows[0].kafka_headers() or first.message != rows[0].message:
        raise AssertionError(f"the bench's rows differ from the store's: {first} {rows[0]}")
    return rows


class Marked:
    """The store, forwarded; ``done`` is set once ``count`` rows were marked sent through it."""

    def __init__(self, inner: EffectStore, count: int) -> None:
        self.inner = inner
        self.count = count
        self.done = anyio.Event()

    async def mark_sent(self, relay: str, ids: Sequence[int]) -> int:
        """Mark on the inner store; count."""
        marked = await self.inner.mark_sent(relay, ids)
        self.count -= marked
        if self.count <= 0:
            self.done.set()
        return marked

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def relay_drain(store: EffectStore, sender: KafkaSender, count: int) -> float:
    """Run the relay (as a pod does) until ``count`` rows are marked sent; return seconds."""
    marked = Marked(store, count)
    relay = Relay(cast(EffectStore, marked), sender, name=f"bench-{uuid.uuid4().hex[:6]}")
    stop = anyio.Event()
    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run, stop)
        with anyio.fail_after(300):
            await marked.done.wait()
        stop.set()
    return time.perf_counter() - started


async def bare_send(producer: Any, rows: list[OutboxRow]) -> float:
    """Send ``rows`` as the relay would (same topic, key, value, headers); return seconds."""
    started = time.perf_counter()
    deliveries = [
        await producer.send(
            row.message.topic,
            value=row.message.value,
            key=row.message.key,
            headers=row.kafka_headers(),
        )
        for row in rows
    ]
    for delivery in deliveries:
        await delivery
    return time.perf_counter() - started


TICKS = os.sysconf("SC_CLK_TCK")
"""Clock ticks per second of /proc's CPU times."""


def tree_cpu() -> tuple[float, float]:
    """CPU seconds so far of this process and of its live descendants (the services), from /proc."""
    parents: dict[int, int] = {}
    seconds: dict[int, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        pid = int(stat.parent.name)
        parents[pid] = int(fields[1])
        seconds[pid] = (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime
    mine, services = os.getpid(), 0.0
    for pid, cpu in seconds.items():
        up = parents.get(pid, 0)
        while up not in (mine, 0, 1) and up in parents:
            up = parents[up]
        services += cpu if up == mine and pid != mine else 0.0
    return seconds.get(mine, 0.0), services


async def timed_cpu(side: Callable[[], Awaitable[float]]) -> tuple[float, float, float]:
    """Run ``side``; return its seconds and the CPU seconds this process and the services spent.

    A full collection first: the garbage of the round's set-up (20,000
    commits) is collected outside either side's time. Without it, the first
    collection of the older generation after the fill fell into whichever
    side ran first, the relay's rounds swung by 30 % with the order
    (bench/README.md, relay); each side still pays for its own garbage.
    """
    gc.collect()
    own, services = tree_cpu()
    seconds = await side()
    own_after, services_after = tree_cpu()
    return seconds, own_after - own, services_after - services


async def relay_part(kafka: LocalKafka, urls: dict[str, str], args: argparse.Namespace) -> None:
    """Paired rounds: the relay drains a backlog; the bare producer sends the same messages."""
    print(f"relay vs bare idempotent producer: {args.messages} messages, one job key each")
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka.bootstrap_servers, acks="all", enable_idempotence=True
    )
    sender = KafkaSender(kafka.bootstrap_servers)
    await producer.start()
    try:
        for kind, url in urls.items():
            async with open_store(url) as opened:
                store = effect_store(opened)
                topic = f"relay-{uuid.uuid4().hex[:8]}"
                kafka.create_topics([topic], partitions=PARTITIONS)
                await fill_outbox(store, topic, 1, "warm")  # connects the relay's producer
                await relay_drain(store, sender, 1)
                rates: dict[str, list[float]] = {"relay": [], "bare": []}
                cpu: dict[str, list[float]] = {"relay": [], "bare": []}  # ms per 1,000 rows
                own: dict[str, list[float]] = {"relay": [], "bare": []}  # this process's share
                for round_no in range(-args.warmup, args.rounds):
                    rows = await fill_outbox(store, topic, args.messages, f"r{round_no}")
                    sides: dict[str, Callable[[], Awaitable[float]]] = {
                        "relay": functools.partial(relay_drain, store, sender, args.messages),
                        "bare": functools.partial(bare_send, producer, rows),
                    }
                    order = list(sides) if round_no % 2 == 0 else list(reversed(sides))
                    for name in order:
                        seconds, mine, services = await timed_cpu(sides[name])
                        rates[name].append(args.messages / seconds)
                        cpu[name].append((mine + services) / args.messages * 1e6)
                        own[name].append(mine / args.messages * 1e6)
                    print(
                        f"  {kind} {f'round {round_no + 1}' if round_no >= 0 else 'warm-up'}:"
                        f" relay {rates['relay'][-1]:7.0f}/s"
                        f" ({cpu['relay'][-1]:.0f} ms CPU per 1,000)  bare"
                        f" {rates['bare'][-1]:7.0f}/s ({cpu['bare'][-1]:.0f} ms)"
                    )
                    if round_no < 0:  # a warm-up round (the table, the plans, the producers)
                        for kept in (rates, cpu, own):  # printed, not counted
                            for values in kept.values():
                                values.pop()
                print(f"{kind}: relay {ratio_line(rates['relay'], rates['bare'])} of bare")
                print(
                    f"{kind}: CPU per 1,000 rows, all processes: relay {spread(cpu['relay'])} ms"
                    f" (this process {spread(own['relay'])}), bare {spread(cpu['bare'])} ms"
                    f" (this process {spread(own['bare'])})"
                )
    finally:
        await sender.aclose()
        await producer.stop()
    print("target: relay >= 0.80x of the bare producer")


# --- the pod with a row and a message per trigger -----------------------------------------


def _pod(
    kafka: LocalKafka, redis_url: str, store_url: str, topic: str, out: str, concurrency: int
) -> tuple[Pod, FirstStart, str]:
    """Return a pod running :class:`RowAndMessage` on ``topic``, its observer and its group."""
    group = f"lw-{uuid.uuid4().hex[:8]}"
    attrs = {"topic": topic, "out": out, "insert": INSERT_ROW[_kind(store_url)]}
    job = type("RowAndMessage", (RowAndMessage,), attrs)()
    config = PodConfig(
        bootstrap_servers=kafka.bootstrap_servers,
        redis_url=redis_url,
        group=group,
        pod="bench",
        namespace=f"bench-{uuid.uuid4().hex[:6]}",
        concurrency=concurrency,
        store_url=store_url,
    )
    first = FirstStart()
    return Pod(job, config, observer=first, store=None), first, group


async def wait_messages(bootstrap: str, topic: str, count: int) -> float:
    """Poll ``topic``'s end offsets until they sum to ``count``; return the time."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    with anyio.fail_after(120):
        await consumer.start()
        try:
            while True:
                ends = await consumer.end_offsets(parts)
                if sum(ends.values()) >= count:
                    return time.perf_counter()
                await anyio.sleep(0.02)
        finally:
            await consumer.stop()


async def pod_side(
    kafka: LocalKafka, redis_url: str, store_url: str, args: argparse.Namespace, topic: str
) -> float:
    """Run the pod on ``topic`` until every offset is committed and every message sent."""
    out = f"{topic}-out"
    kafka.create_topics([out], partitions=PARTITIONS)
    worker, first, group = _pod(kafka, redis_url, store_url, topic, out, args.concurrency)
    async with anyio.create_task_group() as tg:
        await tg.start(_run_worker, worker)
        committed = await wait_committed(kafka.bootstrap_servers, group, topic, args.triggers)
        delivered = await wait_messages(kafka.bootstrap_servers, out, args.triggers)
        worker.stop()
    assert first.at is not None
    return max(committed, delivered) - first.at


class PostgresRowAndSend(PostgresWrites):
    """The hand-written loop's writes: row + identity in one transaction, then the message.

    Not atomic (a crash between the commit and the send loses the message):
    what a loop without an outbox does, as cheaply as it can be done.
    """

    producer: Any = None
    out = "unset"

    async def write(self, key: str, value: bytes, fence: int, batch: SqliteBatch | None) -> None:
        """Insert the row and upsert the identity in one transaction; send; await the ack."""
        async with self._pool.connection(timeout=5) as conn, conn.transaction():
            await conn.execute(INSERT_ROW["postgresql"], (key, 1, time.time()))
            await conn.execute(self._sql, (key, _input_version(value), fence, "null"))
        delivery = await self.producer.send(self.out, value=b'{"n": 1}', key=key.encode())
        await delivery


async def bare_side(
    kafka: LocalKafka,
    redis: Redis,
    writer: PostgresRowAndSend,
    args: argparse.Namespace,
    topic: str,
) -> float:
    """Run the fair baseline on ``topic``; its messages go to a topic of their own."""
    writer.out = f"{topic}-out"
    kafka.create_topics([writer.out], partitions=PARTITIONS)
    return await bare_loop(
        kafka.bootstrap_servers, redis, topic, args.triggers, args.concurrency, writer=writer
    )


async def pod_part(
    kafka: LocalKafka, redis_url: str, urls: dict[str, str], args: argparse.Namespace
) -> None:
    """Paired rounds: the pod (row + message per trigger) against the hand-written loop."""
    url = urls["postgresql"]
    await _create_rows_table(url)
    bare_url = urls["bare-postgresql"]
    await _create_rows_table(bare_url)
    print(f"pod with a row and a message per trigger: {args.triggers} triggers, PostgreSQL")
    async with contextlib.AsyncExitStack() as stack:
        redis = Redis.from_url(redis_url)
        stack.push_async_callback(redis.aclose)
        writer = await PostgresRowAndSend.open(bare_url)
        assert isinstance(writer, PostgresRowAndSend)  # ``open`` makes an instance of its class
        stack.push_async_callback(writer.aclose)
        writer.producer = AIOKafkaProducer(
            bootstrap_servers=kafka.bootstrap_servers, acks="all", enable_idempotence=True
        )
        await writer.producer.start()
        stack.push_async_callback(writer.producer.stop)
        sides: dict[str, Callable[[str], Awaitable[float]]] = {
            "pod": functools.partial(pod_side, kafka, redis_url, url, args),
            "bare": functools.partial(bare_side, kafka, redis, writer, args),
        }
        rates, cpu = await run_rounds(kafka, sides, args)
    print(f"pod {ratio_line(rates['pod'], rates['bare'])} of the hand-written loop")
    print(f"CPU {ratio_line(cpu['bare'], cpu['pod'])} (bare CPU / pod CPU)")


# --- commit-to-receiver latency -------------------------------------------------------------


async def receive(
    bootstrap: str,
    topic: str,
    count: int,
    into: list[float],
    done: anyio.Event,
    first: anyio.Event,
) -> None:
    """Consume ``topic`` from the start; append each record's commit-to-arrival seconds.

    ``first`` is set at the first arrival, ``done`` after ``count`` distinct effects.
    """
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=10
    )
    await consumer.start()
    try:
        seen: set[str] = set()
        while len(seen) < count:
            batch = await consumer.getmany(timeout_ms=100)
            arrived = time.perf_counter()
            for part in batch.values():
                for record in part:
                    effect = dict(record.headers)["leaseworker-effect-id"].decode()
                    if effect in seen:
                        continue
                    seen.add(effect)
                    into.append(arrived - COMMITTED[effect])
                    first.set()
    finally:
        await consumer.stop()
    done.set()


async def latency_run(
    kafka: LocalKafka, redis_url: str, url: str, args: argparse.Namespace, *, idle: bool
) -> list[float]:
    """One pod; idle: ``--idle-triggers`` one at a time; loaded: ``--messages`` at once."""
    topic = f"lat-{uuid.uuid4().hex[:8]}"
    out = f"{topic}-out"
    kafka.create_topics([topic, out], partitions=PARTITIONS)
    count = args.idle_triggers if idle else args.messages
    worker, _, _ = _pod(kafka, redis_url, url, topic, out, args.concurrency)
    latencies: list[float] = []
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
    await producer.start()
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(_run_worker, worker)
            received, first = anyio.Event(), anyio.Event()
            tg.start_soon(
                receive, kafka.bootstrap_servers, out, count + 1, latencies, received, first
            )
            await producer.send_and_wait(topic, b'{"n": 1}', key=b"warm-up")
            with anyio.fail_after(60):  # the relay's producer connects on its first message
                await first.wait()
            latencies.clear()
            if idle:
                for n in range(count):
                    await producer.send_and_wait(topic, b'{"n": 1}', key=f"idle:{n}".encode())
                    await anyio.sleep(args.idle_gap)
            else:
                await produce(kafka.bootstrap_servers, topic, count)
            with anyio.fail_after(120):
                await received.wait()
            worker.stop()
    finally:
        await producer.stop()
    return latencies


async def latency_part(
    kafka: LocalKafka, redis_url: str, urls: dict[str, str], args: argparse.Namespace
) -> None:
    """Commit-to-receiver p50/p99, idle and under load, per store; one pod per run."""
    for kind, url in urls.items():
        if kind.startswith("bare-"):
            continue
        await _create_rows_table(url)
        for idle in (True, False):
            p50s: list[float] = []
            p99s: list[float] = []
            for _ in range(args.rounds):
                found = await latency_run(kafka, redis_url, url, args, idle=idle)
                cuts = statistics.quantiles(found, n=100)
                p50s.append(cuts[49] * 1000)
                p99s.append(cuts[98] * 1000)
            what = "idle" if idle else f"{args.messages} at once"
            print(
                f"{kind} {what}: commit-to-receiver p50 {spread(p50s)} ms,"
                f" p99 {spread(p99s)} ms ({args.rounds} runs)"
            )


# --- reporting and main -----------------------------------------------------------------------


def spread(values: list[float]) -> str:
    """Return the median with its range."""
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def ratio_line(samples: list[float], baseline: list[float]) -> str:
    """Return the median of per-round ratios ``samples / baseline`` with their range."""
    ratios = [side / base for side, base in zip(samples, baseline, strict=True)]
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


async def bench(services: LocalStack, urls: dict[str, str], args: argparse.Namespace) -> None:
    """Run the parts asked for."""
    kafka, redis_url = services.kafka, services.redis.url
    stores = {kind: url for kind, url in urls.items() if not kind.startswith("bare-")}
    if "relay" in args.parts:
        await relay_part(kafka, stores, args)
    if "latency" in args.parts:
        await latency_part(kafka, redis_url, stores, args)
    if "pod" in args.parts and "postgresql" in urls:
        await pod_part(kafka, redis_url, urls, args)


def main() -> None:
    """Parse the arguments, start the services, run the bench."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="relay,latency,pod")
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--triggers", type=int, default=2000)
    parser.add_argument("--idle-triggers", type=int, default=40)
    parser.add_argument("--idle-gap", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="full-size rounds not counted")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--stores", default="postgresql")
    args = parser.parse_args()
    args.parts = set(args.parts.split(","))
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lw-bench-")))
        services = stack.enter_context(LocalStack())
        services.start("redis", "kafka", "postgres")
        urls: dict[str, str] = {}
        for kind in args.stores.split(","):
            if kind == "sqlite":
                urls[kind] = f"sqlite:///{workdir / 'effects.sqlite3'}"
            elif kind == "postgresql":
                urls[kind] = services.postgres.create_database("effects")
                urls["bare-postgresql"] = services.postgres.create_database("bare")
        anyio.run(bench, services, urls, args)


if __name__ == "__main__":
    main()
