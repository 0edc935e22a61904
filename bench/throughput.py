"""Triggers per second end to end: a worker pod against a bare aiokafka loop, same run.

Both sides consume the same number of no-op triggers from a fresh topic in
their own consumer group, against one private Kafka broker and one private
redis-server, and both commit every offset:

- **bare**: an aiokafka consume-and-commit loop that, per record, does what a
  hand-written lock does: ``SET NX PX`` and a Lua compare-and-delete (two
  Redis round trips), ``concurrency`` records at a time, then commits the batch;
- **leaseworker**: an in-process :class:`~leaseworker.Worker` running a job
  whose ``run`` returns at once: lease acquire (fence) and release, the
  executor, per-key serialisation, offset tracking, pauses, commits, and
  the completion store (a lookup before the lease, a claim of the fence
  between the acquire and the job, a fenced completion after the job), once
  per store named in ``--stores`` (see :data:`STORES`). Its
  lease calls are auto-pipelined (calls that queue behind one in flight share
  the next round trip), except on the ``memory-lone`` side.

Timing starts at the first record a side sees and stops when the broker shows
every offset committed (polled the same way for both). Each round runs every
side once, in alternating order; the figure is the median over rounds of the
pod's rate divided by the same round's bare rate, with its quartiles.

    .venv/bin/python bench/throughput.py [--triggers 2000] [--rounds 7] [--concurrency 16]
        [--stores memory,memory-lone,sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import secrets
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import anyio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # type: ignore[import-untyped]
from aiokafka.admin import AIOKafkaAdminClient  # type: ignore[import-untyped]
from redis.asyncio import Redis

from leaseworker import (
    ClaimResult,
    Completion,
    CompletionRequest,
    CompletionResult,
    CompletionStore,
    ExecutionEvent,
    JobContext,
    ReportJob,
    Worker,
    WorkerConfig,
)
from leaseworker._dev._services import LocalRedis
from leaseworker._dev._services._kafka import LocalKafka
from leaseworker._dev._services._postgres import LocalPostgres
from leaseworker._lease._scripts import RELEASE

PARTITIONS = 4


class NoopReport(ReportJob):
    """A job that returns at once: what is left is leaseworker's own cost."""

    topic = "unset"

    async def run(self, ctx: JobContext) -> object:
        """Do nothing."""
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

    async def claim(self, job_key: str, input_version: str, fence: int) -> ClaimResult:
        """Every claim stands: nothing is kept."""
        return ClaimResult(
            status="claimed",
            job_key=job_key,
            input_version=input_version,
            fence=fence,
            highest_fence=fence,
        )

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
    bootstrap: str, redis: Redis, topic: str, count: int, concurrency: int
) -> float:
    """Consume, lock/unlock per record (2 round trips), commit each batch; return seconds."""
    group = f"bare-{uuid.uuid4().hex[:8]}"
    release = redis.register_script(RELEASE)

    async def handle(key: bytes) -> None:
        token = secrets.token_hex(12)
        lock = f"bare:{{{key.decode()}}}:lock"
        with anyio.fail_after(1):
            if await redis.set(lock, token, nx=True, px=30_000):
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
                async with anyio.create_task_group() as inner:
                    for record in records:
                        inner.start_soon(handle, record.key)
                with anyio.fail_after(5):
                    await consumer.commit()
    finally:
        await consumer.stop()
    assert first is not None
    return waiter[0] - first


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
) -> float:
    """Run one in-process worker pod until everything is committed; return seconds.

    ``pipelining=False`` makes the worker send every lease call on its own
    (``WorkerConfig.lease_pipelining``), as the bare loop does.
    """
    group = f"lw-{uuid.uuid4().hex[:8]}"
    job: NoopReport = type("NoopReport", (NoopReport,), {"topic": topic})()
    config = WorkerConfig(
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
    worker = Worker(job, config, observer=first, store=store)
    async with anyio.create_task_group() as tg:
        await tg.start(_run_worker, worker)
        end = await wait_committed(bootstrap, group, topic, count)
        worker.stop()
    assert first.at is not None
    return end - first.at


async def _run_worker(worker: Worker, *, task_status: anyio.abc.TaskStatus[None]) -> None:
    await worker.run(task_status=task_status)


Side = Callable[[str], Awaitable[float]]

STORES = ("memory", "memory-lone", "sqlite-memory", "sqlite", "postgresql", "none")
"""Completion stores a pod side can use (``--stores``).

``memory`` (``memory://``, the in-process store) is the issue-3 comparison:
the pod still looks the identity up, claims its fence and records a fenced
completion per trigger (three store calls), but no database is involved, so what remains is
leaseworker's own cost. ``sqlite-memory`` is SQLite without a disk
(``sqlite:///:memory:``): the cost of the SQL alone. ``sqlite`` is the default
embedded store (a file, WAL, ``synchronous=FULL``, group commit: one fsync per
batch of completions) and ``postgresql`` a private local server (its
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
    )


async def bench(
    kafka: LocalKafka,
    redis_server: LocalRedis,
    store_urls: dict[str, str],
    args: argparse.Namespace,
) -> None:
    redis = Redis.from_url(redis_server.url)
    sides: dict[str, Side] = {
        BARE: lambda topic: bare_loop(
            kafka.bootstrap_servers, redis, topic, args.triggers, args.concurrency
        ),
    }
    for store, url in store_urls.items():
        sides[f"pod, {store} store"] = functools.partial(pod_side, kafka, redis_server, args, url)
    rates: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for round_no in range(args.rounds):
            order = list(sides) if round_no % 2 == 0 else list(reversed(sides))
            for name in order:
                topic = f"bench-{uuid.uuid4().hex[:8]}"
                kafka.create_topics([topic], partitions=PARTITIONS)
                await produce(kafka.bootstrap_servers, topic, args.triggers)
                seconds = await sides[name](topic)
                rates[name].append(args.triggers / seconds)
                print(f"  round {round_no + 1}: {name:24s} {args.triggers / seconds:8.0f} /s")
    finally:
        await redis.aclose()
    print()
    for name, samples in rates.items():
        rate = statistics.median(samples)
        if name == BARE:
            print(f"median {name:24s} {rate:8.0f} triggers/s")
            continue
        # Each round's pod figure against the same round's bare loop: a pair shares
        # whatever else the machine was doing, which swings the rates by ±30 % here.
        paired = [pod / bare for pod, bare in zip(samples, rates[BARE], strict=True)]
        spread = ""
        if len(paired) > 1:
            q1, _, q3 = statistics.quantiles(paired, n=4)
            spread = f"  (quartiles {q1:.2f}-{q3:.2f})"
        ratio = statistics.median(paired)
        print(f"median {name:24s} {rate:8.0f} triggers/s  {ratio:5.2f}x of bare{spread}")
    print("target: pod with the memory store >= 0.80x of bare (median of per-round ratios)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--triggers", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--concurrency", type=int, default=16)
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
    print(
        f"{args.triggers} no-op triggers over {PARTITIONS} partitions, "
        f"concurrency {args.concurrency}, {args.rounds} rounds per side"
    )
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lw-bench-")))
        redis_server = LocalRedis.start()
        stack.callback(redis_server.stop)
        kafka = LocalKafka.start()
        stack.callback(kafka.stop)
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
                postgres = LocalPostgres.start()
                stack.callback(postgres.stop)
                urls[store] = postgres.create_database("bench")
        anyio.run(bench, kafka, redis_server, urls, args)


if __name__ == "__main__":
    main()
