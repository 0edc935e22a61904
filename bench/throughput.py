"""Triggers per second end to end: a worker pod against a bare aiokafka loop, same run.

Both sides consume the same number of no-op triggers from a fresh topic in
their own consumer group, against one private Kafka broker and one private
redis-server, and both commit every offset:

- **bare**: an aiokafka consume-and-commit loop that, per record, does what a
  hand-written lock does: ``SET NX PX`` and a Lua compare-and-delete (two
  Redis round trips), ``concurrency`` records at a time, then commits the batch;
- **leaseworker**: an in-process :class:`~leaseworker.Pod` running a job
  whose ``run`` returns at once: lease acquire (fence) and release, the
  executor, per-key serialisation, offset tracking, pauses, commits, and
  the completion store (one lookup per poll before the leases, a claim of the fence
  between the acquire and the job, a fenced completion after the job), once
  per store named in ``--stores`` (see :data:`STORES`). Its
  lease calls are auto-pipelined (calls that queue behind one in flight share
  the next round trip), except on the ``memory-lone`` side;
- **bare + sqlite write**, **bare + postgresql write** (with the ``sqlite`` and
  ``postgresql`` pod sides): the fair baselines of the durable lines, the bare
  loop also writing what a hand-written effectively-once loop must, per record
  and while it holds the lock: one upsert of identity, fence and result, in a
  transaction (:data:`_BARE_UPSERT`); on PostgreSQL one autocommit round trip
  per record, on a SQLite file (WAL, ``synchronous=FULL``) the poll's records
  in one transaction, so one fsync per poll as the pod's group commit.

Timing starts at the first record a side sees and stops when the broker shows
every offset committed (polled the same way for both). Each round runs every
side once, in alternating order; the figure is the median over rounds of the
pod's rate divided by the same round's bare rate, with its quartiles; a durable
pod side is also divided by its fair baseline ("fair"), and the baseline's CPU
per trigger by the pod's ("CPU", this process's CPU time: steadier than the
rates on a loaded machine).

    .venv/bin/python bench/throughput.py [--triggers 2000] [--rounds 7] [--concurrency 16]
        [--stores memory,memory-lone,sqlite,postgresql] [--cpu-ms 10]

``--cpu-ms N``: every job burns N ms of CPU time in a child process instead of
returning at once: the pod's through ``ctx.run_in_process`` (its pool of
``--process-workers``, the cores), the bare loop's, while it holds the lock,
through ``loop.run_in_executor`` on a warm ``ProcessPoolExecutor`` of the
cores (the hand-written way).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import hashlib
import os
import secrets
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import anyio
import process_jobs
import psycopg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # type: ignore[import-untyped]
from aiokafka.admin import AIOKafkaAdminClient  # type: ignore[import-untyped]
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from leaseworker import (
    ClaimResult,
    Completion,
    CompletionRequest,
    CompletionResult,
    CompletionStore,
    ExecutionEvent,
    JobContext,
    Pod,
    PodConfig,
    ReportJob,
)
from leaseworker._lease._scripts import RELEASE
from leaseworker_dev._services import LocalRedis
from leaseworker_dev._services._kafka import LocalKafka
from leaseworker_dev._services._local_stack import LocalStack

PARTITIONS = 4


class NoopReport(ReportJob):
    """A job that returns at once: what is left is leaseworker's own cost."""

    topic = "unset"

    async def run(self, ctx: JobContext) -> object:
        """Do nothing."""
        return None


class CpuReport(ReportJob):
    """A job whose work is ``seconds`` of CPU time in a child (``ctx.run_in_process``)."""

    topic = "unset"
    seconds = 0.01

    async def run(self, ctx: JobContext) -> object:
        """Burn ``seconds`` of CPU in one of the pod's process workers."""
        await ctx.run_in_process(process_jobs.burn, self.seconds)
        return None


class NullStore:
    """Bench-only: a completion store that keeps nothing and answers at once.

    Not something a pod can be configured with (a pod without a durable record
    could recompute redelivered triggers); the ``none`` side uses it to show how
    much of the gap to the bare loop the three store calls per trigger account for.
    """

    async def lookup(self, job_key: str, input_version: str) -> Completion | None:
        """Nothing ever completed."""
        return None

    async def lookup_many(self, identities: Sequence[tuple[str, str]]) -> list[Completion | None]:
        """Nothing ever completed."""
        return [None] * len(identities)

    async def claim(self, job_key: str, input_version: str, fence: int) -> ClaimResult:
        """Every claim stands: nothing is kept."""
        return ClaimResult(
            status="claimed",
            job_key=job_key,
            input_version=input_version,
            fence=fence,
            highest_fence=fence,
        )

    def settled_by_offsets(self) -> NullStore:
        """Return this store: there is nothing to make durable."""
        return self

    async def durable(self) -> None:
        """Nothing to wait for."""

    async def complete(self, request: CompletionRequest) -> CompletionResult:
        """Accept every completion without recording it."""
        done = Completion(
            job_key=request.job_key,
            input_version=request.input_version,
            fence=request.fence,
            result=None,
            execution_id=request.execution_id,
            pod=request.pod,
            completed_at=datetime.now(UTC),
        )
        return CompletionResult(
            status="accepted",
            job_key=request.job_key,
            input_version=request.input_version,
            fence=request.fence,
            winning_fence=request.fence,
            completion=done,
        )

    async def state(self, job_key: str) -> Completion | None:
        """Nothing is kept."""
        return None

    async def aclose(self) -> None:
        """Nothing to close."""


class FirstStart:
    """Observer noting when the first execution started."""

    def __init__(self) -> None:
        self.at: float | None = None

    def on_event(self, event: ExecutionEvent) -> None:
        """Remember the first ``started`` event's time."""
        if self.at is None and event.event == "started":
            self.at = time.perf_counter()


async def produce(bootstrap: str, topic: str, count: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    with anyio.fail_after(60):
        await producer.start()
        try:
            sent = [
                await producer.send(topic, key=f"bench:{i}".encode(), value=b'{"n": 1}')
                for i in range(count)
            ]
            for delivery in sent:
                await delivery
        finally:
            await producer.stop()


async def wait_committed(bootstrap: str, group: str, topic: str, count: int) -> float:
    """Poll the group's committed offsets until they sum to ``count``; return the time."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    with anyio.fail_after(120):
        await admin.start()
        try:
            while True:
                offsets = await admin.list_consumer_group_offsets(group)
                total = sum(m.offset for tp, m in offsets.items() if tp.topic == topic)
                if total >= count:
                    return time.perf_counter()
                await anyio.sleep(0.02)
        finally:
            await admin.close()


async def bare_loop(
    bootstrap: str,
    redis: Redis,
    topic: str,
    count: int,
    concurrency: int,
    writer: BareWriter | None = None,
    work: Callable[[], Awaitable[object]] | None = None,
) -> float:
    """Consume, lock/unlock per record (2 round trips), commit each batch; return seconds.

    With ``writer``, each record's result is also written durably while the
    lock is held (see :class:`PostgresWrites`, :class:`SqliteWrites`); with
    ``work``, it is awaited while the lock is held (the job).
    """
    group = f"bare-{uuid.uuid4().hex[:8]}"
    release = redis.register_script(RELEASE)

    async def handle(key: bytes, value: bytes, batch: SqliteBatch | None) -> None:
        token = secrets.token_hex(12)
        lock = f"bare:{{{key.decode()}}}:lock"
        with anyio.fail_after(5):
            if await redis.set(lock, token, nx=True, px=30_000):
                if work is not None:
                    await work()
                if writer is not None:
                    fence = time.time_ns() // 1000  # time-floored, as the pod's fences are
                    # Keyed by topic, as the pod's by its namespace: each side's run
                    # writes new rows (a key written before would change nothing).
                    await writer.write(f"{topic}:{{{key.decode()}}}", value, fence, batch)
                await release(keys=[lock], args=[token])

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=concurrency,
    )
    first: float | None = None
    await consumer.start()
    try:
        async with anyio.create_task_group() as tg:
            waiter: list[float] = []

            async def watch() -> None:
                waiter.append(await wait_committed(bootstrap, group, topic, count))

            tg.start_soon(watch)
            while not waiter:
                batch = await consumer.getmany(timeout_ms=200, max_records=concurrency)
                records = [r for part in batch.values() for r in part]
                if not records:
                    continue
                first = first or time.perf_counter()
                batch = writer.batch() if writer is not None else None
                async with anyio.create_task_group() as inner:
                    for record in records:
                        inner.start_soon(handle, record.key, record.value, batch)
                if batch is not None:
                    await batch.commit()
                with anyio.fail_after(5):
                    await consumer.commit()
    finally:
        await consumer.stop()
    assert first is not None
    return waiter[0] - first


_BARE_UPSERT = """
    INSERT INTO bare_results AS r (job_key, input_version, fence, result, written_at)
    VALUES ({p}, {p}, {p}, {p}, {now})
    ON CONFLICT (job_key) DO UPDATE
    SET input_version = EXCLUDED.input_version, fence = EXCLUDED.fence,
        result = EXCLUDED.result, written_at = EXCLUDED.written_at
    WHERE r.fence <= EXCLUDED.fence AND r.input_version <> EXCLUDED.input_version
"""
"""What a hand-written effectively-once write does: identity, fence and result in one row.

The row is replaced only by a higher-or-equal fence with a new input version
(a redelivered record changes nothing), in one statement and so one transaction.
"""


class SqliteBatch:
    """The records of one poll in the bare SQLite loop: their writes share one transaction."""

    def __init__(self, writes: SqliteWrites) -> None:
        self._writes = writes
        self._rows: list[tuple[str, str, int, str]] = []

    def add(self, row: tuple[str, str, int, str]) -> None:
        """Queue one record's row for the poll's transaction."""
        self._rows.append(row)

    async def commit(self) -> None:
        """Write every queued row in one ``BEGIN IMMEDIATE ... COMMIT`` (one fsync)."""
        if self._rows:
            await anyio.to_thread.run_sync(self._writes.write_rows, self._rows)


class SqliteWrites:
    """The bare loop's durable write on a SQLite file: WAL, ``synchronous=FULL``.

    A hand-written loop that commits each poll's offsets after its records
    would write the poll's rows in one transaction, one fsync per poll, as the
    pod's group commit does (a commit per record would measure the disk, not
    the store): each record is one upsert of its identity, fence and result.
    """

    def __init__(self, path: Path) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("PRAGMA synchronous = FULL")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS bare_results (job_key TEXT PRIMARY KEY,"
            " input_version TEXT NOT NULL, fence INTEGER NOT NULL, result TEXT NOT NULL,"
            " written_at INTEGER NOT NULL)"
        )
        self._sql = _BARE_UPSERT.format(p="?", now="?")

    def batch(self) -> SqliteBatch:
        """Start the writes of one poll."""
        return SqliteBatch(self)

    async def write(self, key: str, value: bytes, fence: int, batch: SqliteBatch | None) -> None:
        """Queue the record's row in the poll's transaction."""
        assert batch is not None
        batch.add((key, _input_version(value), fence, "null"))

    def write_rows(self, rows: list[tuple[str, str, int, str]]) -> None:
        """Run in a worker thread: one transaction for the poll's rows."""
        now = time.time_ns() // 1000
        self._conn.execute("BEGIN IMMEDIATE")
        self._conn.executemany(self._sql, [(*row, now) for row in rows])
        self._conn.execute("COMMIT")

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()


class PostgresWrites:
    """The bare loop's durable write on PostgreSQL: one autocommit upsert per record.

    Over a pool as large as the pod's (10 connections), so the records of a
    poll write concurrently, one round trip and one transaction each.
    """

    def __init__(self, pool: AsyncConnectionPool[psycopg.AsyncConnection[TupleRow]]) -> None:
        self._pool = pool
        self._sql = _BARE_UPSERT.format(p="%s", now="now()")

    @classmethod
    async def open(cls, url: str) -> PostgresWrites:
        """Open the pool and create the table."""
        pool: AsyncConnectionPool[psycopg.AsyncConnection[TupleRow]] = AsyncConnectionPool(
            url, open=False, min_size=1, max_size=10, kwargs={"autocommit": True}
        )
        await pool.open(wait=True, timeout=10)
        async with pool.connection() as conn:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS bare_results (job_key text PRIMARY KEY,"
                " input_version text NOT NULL, fence bigint NOT NULL, result jsonb NOT NULL,"
                " written_at timestamptz NOT NULL)"
            )
        return cls(pool)

    def batch(self) -> None:
        """Return nothing: records write on their own, nothing is shared by a poll."""

    async def write(self, key: str, value: bytes, fence: int, batch: SqliteBatch | None) -> None:
        """Upsert the record's row: one round trip, one transaction."""
        async with self._pool.connection(timeout=5) as conn:
            await conn.execute(self._sql, (key, _input_version(value), fence, "null"))

    async def aclose(self) -> None:
        """Close the pool."""
        await self._pool.close()


BareWriter = SqliteWrites | PostgresWrites


def _input_version(value: bytes) -> str:
    """Return the record's input version: a hash of its payload, as the pod's default."""
    return "sha256:" + hashlib.sha256(value).hexdigest()


async def leaseworker_pod(
    bootstrap: str,
    redis_url: str,
    topic: str,
    count: int,
    concurrency: int,
    store_url: str,
    store: CompletionStore | None = None,
    *,
    pipelining: bool = True,
    cpu: float = 0.0,
) -> float:
    """Run one in-process worker pod until everything is committed; return seconds.

    ``pipelining=False`` makes the worker send every lease call on its own
    (``PodConfig.lease_pipelining``), as the bare loop does. ``cpu``: each
    job burns that many seconds of CPU through ``ctx.run_in_process``.
    """
    group = f"lw-{uuid.uuid4().hex[:8]}"
    base: type[ReportJob] = CpuReport if cpu else NoopReport
    job = type(base.__name__, (base,), {"topic": topic, "seconds": cpu})()
    config = PodConfig(
        bootstrap_servers=bootstrap,
        redis_url=redis_url,
        group=group,
        pod="bench",
        namespace=f"bench-{uuid.uuid4().hex[:6]}",
        concurrency=concurrency,
        store_url=store_url,
        lease_pipelining=pipelining,
    )
    first = FirstStart()
    worker = Pod(job, config, observer=first, store=store)
    async with anyio.create_task_group() as tg:
        await tg.start(_run_worker, worker)
        end = await wait_committed(bootstrap, group, topic, count)
        worker.stop()
    assert first.at is not None
    return end - first.at


async def _run_worker(worker: Pod, *, task_status: anyio.abc.TaskStatus[None]) -> None:
    await worker.run(task_status=task_status)


Side = Callable[[str], Awaitable[float]]
"""One side of the bench: run on a topic, return seconds."""

STORES = ("memory", "memory-lone", "sqlite-memory", "sqlite", "postgresql", "none")
"""Completion stores a pod side can use (``--stores``).

``memory`` (``memory://``, the in-process store) is the issue-3 comparison:
the pod still looks the identity up, claims its fence and records a fenced
completion per trigger (three store calls), but no database is involved, so what remains is
leaseworker's own cost. ``sqlite-memory`` is SQLite without a disk
(``sqlite:///:memory:``): the cost of the SQL alone. ``sqlite`` is the default
embedded store (a file, WAL, commits on the loop, group fsync in a helper
process) and ``postgresql`` a private local server (its
throwaway cluster runs with ``fsync=off``, so that line is the client's cost
of a round trip per call): durability's price, reported as separate lines.
``none`` is a bench-only :class:`NullStore`: the pod's cost without the two
store calls. ``memory-lone`` is ``memory`` with Redis auto-pipelining off:
every lease call goes to Redis on its own, exactly as the bare loop sends its
two commands (the figure for the pod's own cost per trigger, pipelining aside).
"""

BARE = "bare aiokafka loop"
NULL_STORE = "none"
LONE = "memory-lone"


async def pod_side(
    kafka: LocalKafka, redis_server: LocalRedis, args: argparse.Namespace, url: str, topic: str
) -> float:
    """Run the pod side on ``topic`` with the completion store at ``url``."""
    pipelining = True
    if url == NULL_STORE:  # the worker is handed the store; its URL is never opened
        url, store = "memory://", NullStore()
    else:
        store = None
    if url == LONE:
        url, pipelining = "memory://", False
    return await leaseworker_pod(
        kafka.bootstrap_servers,
        redis_server.url,
        topic,
        args.triggers,
        args.concurrency,
        url,
        store,
        pipelining=pipelining,
        cpu=args.cpu_ms / 1000,
    )


FAIR = ("sqlite", "postgresql")
"""Durable pod sides that also get a fair baseline: the bare loop writing the same store."""


def fair_name(store: str) -> str:
    """Name of the bare side that writes durably to ``store``'s kind of database."""
    return f"bare + {store} write"


async def open_writers(
    store_urls: dict[str, str], workdir: Path, stack: contextlib.AsyncExitStack
) -> dict[str, BareWriter]:
    """Open the fair baselines' writers for the durable stores among ``store_urls``."""
    writers: dict[str, BareWriter] = {}
    if "sqlite" in store_urls:
        sqlite_writes = SqliteWrites(workdir / "bare.sqlite3")
        stack.callback(sqlite_writes.close)
        writers["sqlite"] = sqlite_writes
    if "postgresql" in store_urls:
        pg_writes = await PostgresWrites.open(store_urls["bare-postgresql"])
        stack.push_async_callback(pg_writes.aclose)
        writers["postgresql"] = pg_writes
    return writers


async def bench(
    kafka: LocalKafka,
    redis_server: LocalRedis,
    store_urls: dict[str, str],
    args: argparse.Namespace,
    workdir: Path,
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        redis = Redis.from_url(redis_server.url)
        stack.push_async_callback(redis.aclose)
        writers = await open_writers(store_urls, workdir, stack)
        work = None
        if args.cpu_ms:
            work = await _executor_work(args.cpu_ms / 1000, stack)
        sides: dict[str, Side] = {
            BARE: functools.partial(
                bare_loop,
                kafka.bootstrap_servers,
                redis,
                count=args.triggers,
                concurrency=args.concurrency,
                work=work,
            ),
        }
        for store, writer in writers.items():
            sides[fair_name(store)] = functools.partial(
                bare_loop,
                kafka.bootstrap_servers,
                redis,
                count=args.triggers,
                concurrency=args.concurrency,
                writer=writer,
                work=work,
            )
        for store, url in store_urls.items():
            if store.startswith("bare-"):
                continue
            sides[f"pod, {store} store"] = functools.partial(
                pod_side, kafka, redis_server, args, url
            )
        rates, cpu = await run_rounds(kafka, sides, args)
    report(rates, cpu, {f"pod, {store} store": fair_name(store) for store in writers})


async def _executor_work(
    seconds: float, stack: contextlib.AsyncExitStack
) -> Callable[[], Awaitable[object]]:
    """Return the bare loop's job: ``seconds`` of CPU in a warm ProcessPoolExecutor of the cores."""
    executor = ProcessPoolExecutor(max_workers=os.cpu_count())
    stack.callback(executor.shutdown, wait=True, cancel_futures=True)
    loop = asyncio.get_running_loop()
    job = functools.partial(process_jobs.burn, None, seconds)
    for warm in [loop.run_in_executor(executor, job) for _ in range(2 * (os.cpu_count() or 1))]:
        await warm

    async def work() -> object:
        return await loop.run_in_executor(executor, job)

    return work


async def run_rounds(
    kafka: LocalKafka, sides: dict[str, Side], args: argparse.Namespace
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Run every side once per round, in alternating order; return rates and CPU per 1000.

    CPU is this process's (``time.process_time``: every thread, user and
    system) per 1000 triggers, start-up included: less sensitive than the
    rates to what else the machine runs, which shows in wall time only.
    """
    rates: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    for round_no in range(args.rounds):
        order = list(sides) if round_no % 2 == 0 else list(reversed(sides))
        for name in order:
            topic = f"bench-{uuid.uuid4().hex[:8]}"
            kafka.create_topics([topic], partitions=PARTITIONS)
            await produce(kafka.bootstrap_servers, topic, args.triggers)
            started = time.process_time()
            seconds = await sides[name](topic)
            cpu[name].append((time.process_time() - started) / args.triggers * 1e6)
            rates[name].append(args.triggers / seconds)
            print(
                f"  round {round_no + 1}: {name:28s} {args.triggers / seconds:8.0f} /s"
                f"  {cpu[name][-1]:6.0f} ms CPU per 1000"
            )
    return rates, cpu


def paired(samples: list[float], baseline: list[float]) -> str:
    """Return the median of per-round ratios ``samples / baseline`` with quartiles."""
    ratios = [side / base for side, base in zip(samples, baseline, strict=True)]
    spread = ""
    if len(ratios) > 1:
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        spread = f" (quartiles {q1:.2f}-{q3:.2f})"
    return f"{statistics.median(ratios):5.2f}x{spread}"


def report(
    rates: dict[str, list[float]], cpu: dict[str, list[float]], fair: dict[str, str]
) -> None:
    """Print each side's median rate, its ratio to the bare loop, and the fair ratios.

    A fair line also shows the CPU ratio: the baseline's CPU per trigger over
    the pod's, paired by round (above 1: the pod spends less).
    """
    print()
    for name, samples in rates.items():
        rate = statistics.median(samples)
        per_1000 = f"{statistics.median(cpu[name]):6.0f} ms CPU/1000"
        if name == BARE:
            print(f"median {name:28s} {rate:8.0f} triggers/s {per_1000}")
            continue
        # Each round's pod figure against the same round's bare loop: a pair shares
        # whatever else the machine was doing, which swings the rates by ±30 % here.
        line = f"median {name:28s} {rate:8.0f} triggers/s {per_1000}"
        line += f"  {paired(samples, rates[BARE])} of bare"
        if name in fair:
            base = fair[name]
            line += f"\n{'':35s}fair: {paired(samples, rates[base])} of {base}"
            line += f"\n{'':35s}CPU:  {paired(cpu[base], cpu[name])} ({base} CPU / pod CPU)"
        print(line)
    print("target: pod with the memory store >= 0.90x of bare (median of per-round ratios;")
    print("with --cpu-ms, the pod's run_in_process against the bare loop's ProcessPoolExecutor)")
    if fair:
        print("target: pod with a durable store >= 0.90x of the bare loop writing the same store")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--triggers", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--cpu-ms",
        type=float,
        default=0.0,
        help="each trigger's job burns this much CPU in a child process: the pod's through "
        "ctx.run_in_process, the bare loop's through a ProcessPoolExecutor (default: no-op)",
    )
    parser.add_argument(
        "--stores",
        default="memory,memory-lone,sqlite",
        help=f"comma-separated pod sides, from {', '.join(STORES)} "
        "(default: memory,memory-lone,sqlite)",
    )
    args = parser.parse_args()
    stores = [name for name in args.stores.split(",") if name]
    unknown = set(stores) - set(STORES)
    if unknown or not stores:
        parser.error(f"--stores takes names from {', '.join(STORES)}, got {args.stores!r}")
    kind = f"{args.cpu_ms:g} ms CPU" if args.cpu_ms else "no-op"
    print(
        f"{args.triggers} {kind} triggers over {PARTITIONS} partitions, "
        f"concurrency {args.concurrency}, {args.rounds} rounds per side"
    )
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lw-bench-")))
        services = stack.enter_context(LocalStack())
        services.start("redis", "kafka")  # PostgreSQL starts below if asked for
        urls = store_urls(services, stores, workdir)
        anyio.run(bench, services.kafka, services.redis, urls, args, workdir)


def store_urls(services: LocalStack, stores: list[str], workdir: Path) -> dict[str, str]:
    """Return each pod side's store URL (starting PostgreSQL if asked for) and the bare one's."""
    urls: dict[str, str] = {}
    for store in stores:
        if store == "memory":
            urls[store] = "memory://"
        elif store == "sqlite-memory":
            urls[store] = "sqlite:///:memory:"
        elif store in (NULL_STORE, LONE):
            urls[store] = store
        elif store == "sqlite":
            urls[store] = f"sqlite:///{workdir / 'completions.sqlite3'}"
        else:
            urls[store] = services.postgres.create_database("bench")
            urls["bare-postgresql"] = services.postgres.create_database("bare")
    return urls


if __name__ == "__main__":
    main()
