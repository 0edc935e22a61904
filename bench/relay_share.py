"""The relay's share of a pod's store connections: the jobs' transactions while a backlog drains.

One pod on PostgreSQL runs a job that inserts a row, runs a statement of
``--statement`` seconds (``pg_sleep``: a report's own SQL, without the CPU)
and publishes a message in ``ctx.transaction()``, fed triggers at a steady
``--rate``. The latency of
its transactions (the block, from entry to commit) is taken for ``--quiet``
seconds with no backlog, then while the pod's relay drains ``--backlog`` rows
committed at once (one statement, as an outage of the broker leaves them; one
job key each). Paired rounds of alternating order, each on a fresh database,
compare the relay's share of the pod's 10 pooled connections: ``bounded``
(the store's default), ``whole`` (``relay_connections=10``: the relay
takes what its rounds want, up to 6 claims and a prune, as before the bound)
or a number of connections.
``--ack-delay`` holds each wave's acknowledgements back that long in the
relay's sender (a replicated cluster's ``acks=all``, without one): rounds
then hold their connections through longer sends, and overlap more.
``--mark-delay`` holds each mark back that long on its claim's connection
(a commit waiting for a distant synchronous standby): the marks then pile
up beside the rounds, as they may in production.
Per round: the drain's rate and the most connections the relay held at
once during it (counted at the store's share as each claim takes one); per
side, p50 / p99 of every round's samples together.

    .venv/bin/python bench/relay_share.py [--rate 30] [--statement 0.2] [--backlog 20000]
        [--quiet 5] [--rounds 3] [--concurrency 16] [--ack-delay 0] [--mark-delay 0]
        [--shares bounded,whole]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
import uuid
from collections.abc import Sequence
from typing import Any

import anyio
import psycopg
from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]
from throughput import PARTITIONS, _run_worker

from leaseworker import JobContext, Pod, PodConfig, ReportJob, open_store
from leaseworker._kafka import KafkaSender
from leaseworker._store._effect_rows import OutboxRow, encode_headers
from leaseworker._store._postgres import PostgresStore
from leaseworker._worker import _pod_relay
from leaseworker_dev._services._local_stack import LocalStack

POOL = 10
"""The pod's pooled store connections (``open_store``'s default)."""

SAMPLES: list[tuple[float, float]] = []
"""(when the block began, its seconds) per transaction of the round running (``perf_counter``)."""

ROWS = "CREATE TABLE IF NOT EXISTS bench_rows (job_key text, n bigint, at float8)"

# One statement: the rows and their places in the queue of unsent ids, as a commit writes them.
BACKLOG = """
    WITH added AS (
        INSERT INTO leaseworker_outbox
            (job_key, input_version, seq, fence, topic, msg_key, value, headers, trace,
             effect_id, queued)
        SELECT 'backlog:' || n, 'v1', 0, 1, %(topic)s, convert_to('backlog:' || n, 'UTF8'),
               '\\x7b7d'::bytea, %(headers)s, %(headers)s, 'lw1:' || md5(n::text) || ':0', true
        FROM generate_series(1, %(count)s) n
        RETURNING id, job_key
    )
    INSERT INTO leaseworker_outbox_unsent (id, job_key) SELECT id, job_key FROM added
"""
LEFT = "SELECT count(*) FROM leaseworker_outbox_unsent WHERE starts_with(job_key, 'backlog:')"


class LateAcks:
    """The pod's sender, each wave's answers returned ``delay`` seconds after the broker's."""

    delay = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._inner = KafkaSender(*args, **kwargs)

    async def send_batch(self, rows: Sequence[OutboxRow]) -> list[tuple[int, int] | Exception]:
        """Send as the pod's sender does; wait ``delay``; answer."""
        answers = await self._inner.send_batch(rows)
        await anyio.sleep(self.delay)
        return answers

    async def aclose(self) -> None:
        """Close the pod's sender."""
        await self._inner.aclose()


class Peak:
    """The most connections of its share a store's relay held at once since :meth:`reset`.

    Counted as each claim takes one (its share less what is free), so no
    overlap is missed between samples.
    """

    def __init__(self, store: PostgresStore) -> None:
        self.most = 0
        claims = store._claims
        take = claims._connection

        async def counted() -> Any:
            conn = await take()
            self.most = max(self.most, claims.share - claims._slots.value)
            return conn

        setattr(claims, "_connection", counted)  # noqa: B010 - a method replaced for the count

    def reset(self) -> None:
        """Count from now on."""
        self.most = 0


def slow_marks(store: PostgresStore, delay: float) -> None:
    """Hold every end of a claim (mark or release) back ``delay`` seconds, its connection held."""
    claims = store._claims
    update = claims.update

    async def later(what: str, relay: str, ids: Sequence[int]) -> int:
        await anyio.sleep(delay)
        return await update(what, relay, ids)

    setattr(claims, "update", later)  # noqa: B010 - a method replaced for the delay


class RowAndMessage(ReportJob):
    """One row and one message per trigger in the completion's transaction, timed."""

    topic = "unset"
    out = "unset"
    statement = 0.0

    async def run(self, ctx: JobContext) -> object:
        """Insert the row, run the statement, publish the message, complete; time the block."""
        began = time.perf_counter()
        async with ctx.transaction() as tx:
            await tx.execute(
                "INSERT INTO bench_rows (job_key, n, at) VALUES (%s, %s, %s)",
                (ctx.job_key, 1, time.time()),
            )
            if self.statement:
                await tx.execute("SELECT pg_sleep(%s)", (self.statement,))
            tx.publish(self.out, b'{"n": 1}', key=ctx.job_key)
            tx.complete(None)
        SAMPLES.append((began, time.perf_counter() - began))
        return None


async def feed(bootstrap: str, topic: str, rate: float, stop: anyio.Event) -> None:
    """Produce a trigger every ``1 / rate`` seconds (on a schedule) until ``stop`` is set."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=1)
    await producer.start()
    try:
        start, n = time.perf_counter(), 0
        while not stop.is_set():
            delay = start + n / rate - time.perf_counter()
            if delay > 0:
                await anyio.sleep(delay)
            await producer.send(topic, key=f"t:{n}".encode(), value=b'{"n": 1}')
            n += 1
    finally:
        await producer.stop()


async def drain(url: str, topic: str, count: int, peak: Peak) -> tuple[float, float]:
    """Commit ``count`` outbox rows at once; return when, and when none of them was unsent.

    Polled every 20 ms (``perf_counter``); ``peak`` counts from the commit on.
    """
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        params = {"topic": topic, "count": count, "headers": encode_headers(())}
        await conn.execute(BACKLOG, params)
        committed = time.perf_counter()
        peak.reset()
        with anyio.fail_after(300):
            while True:
                left = await (await conn.execute(LEFT)).fetchone()
                assert left is not None  # an aggregate: one row
                if left[0] == 0:
                    return committed, time.perf_counter()
                await anyio.sleep(0.02)


async def one_round(
    services: LocalStack, share: str, n: int, args: argparse.Namespace
) -> dict[str, Any]:
    """Run the pod with the relay's ``share``: quiet, then a drain; return the round's figures."""
    kafka = services.kafka
    url = services.postgres.create_database(f"share_{share}_{n}")
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(ROWS)
    topic = f"share-{uuid.uuid4().hex[:8]}"
    out, backlog_topic = f"{topic}-out", f"{topic}-backlog"
    kafka.create_topics([topic, out, backlog_topic], partitions=PARTITIONS)
    attrs = {"topic": topic, "out": out, "statement": args.statement}
    job = type("RowAndMessage", (RowAndMessage,), attrs)()
    config = PodConfig(
        bootstrap_servers=kafka.bootstrap_servers,
        redis_url=services.redis.url,
        group=f"lw-{uuid.uuid4().hex[:8]}",
        pod="share",
        namespace=f"share-{uuid.uuid4().hex[:6]}",
        concurrency=args.concurrency,
        store_url=url,
    )
    named: dict[str, int | None] = {"bounded": None, "whole": POOL}
    relay_connections = named[share] if share in named else int(share)
    SAMPLES.clear()
    stop = anyio.Event()
    async with open_store(url, relay_connections=relay_connections) as store:
        assert isinstance(store, PostgresStore)
        peak = Peak(store)
        if args.mark_delay:
            slow_marks(store, args.mark_delay)
        pod = Pod(job, config, store=store)
        async with anyio.create_task_group() as tg:
            await tg.start(_run_worker, pod)
            tg.start_soon(feed, kafka.bootstrap_servers, topic, args.rate, stop)
            with anyio.fail_after(60):  # the group's join, the producers' first sends
                while len(SAMPLES) < args.rate:  # noqa: ASYNC110 - the job appends, no event
                    await anyio.sleep(0.1)
            quiet_from = time.perf_counter()
            await anyio.sleep(args.quiet)
            quiet_to = time.perf_counter()
            began, drained = await drain(url, backlog_topic, args.backlog, peak)
            await anyio.sleep(0.5)  # the last transactions begun in the drain end
            stop.set()
            pod.stop()
    return {
        "quiet": [s for at, s in SAMPLES if quiet_from <= at < quiet_to],
        "drain": [s for at, s in SAMPLES if began <= at < drained],
        "rate": args.backlog / (drained - began),
        "seconds": drained - began,
        "claims": peak.most,
    }


def quantiles(values: list[float]) -> str:
    """Return p50 / p99 in ms and the sample count."""
    if len(values) < 2:
        return f"({len(values)} samples)"
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return f"p50 {cuts[49] * 1000:6.1f} ms, p99 {cuts[98] * 1000:6.1f} ms ({len(values)})"


async def bench(services: LocalStack, args: argparse.Namespace) -> None:
    """Paired rounds of the shares asked for; print each round and the sides' summary."""
    shares = args.shares
    print(
        f"relay share: {args.rate:.0f} transactions/s of a {args.statement * 1000:.0f} ms"
        f" statement, concurrency {args.concurrency}, acks {args.ack_delay * 1000:.0f} ms late,"
        f" marks {args.mark_delay * 1000:.0f} ms late,"
        f" backlog {args.backlog} rows, load {os.getloadavg()[0]:.1f}"
    )
    kept: dict[str, list[dict[str, Any]]] = {share: [] for share in shares}
    for n in range(args.rounds):
        order = shares if n % 2 == 0 else list(reversed(shares))
        for share in order:
            figures = await one_round(services, share, n, args)
            kept[share].append(figures)
            print(
                f"  round {n + 1} {share:7}: quiet {quantiles(figures['quiet'])};"
                f" drain {quantiles(figures['drain'])}; drained in {figures['seconds']:.2f} s"
                f" ({figures['rate']:.0f} rows/s), relay held at most {figures['claims']}"
                f" (load {os.getloadavg()[0]:.1f})"
            )
    for share, rounds in kept.items():
        quiet = [s for figures in rounds for s in figures["quiet"]]
        during = [s for figures in rounds for s in figures["drain"]]
        rates = [figures["rate"] for figures in rounds]
        print(
            f"{share}: quiet {quantiles(quiet)}; drain {quantiles(during)};"
            f" drain rate {statistics.median(rates):.0f} rows/s"
            f" ({min(rates):.0f}-{max(rates):.0f}),"
            f" relay held at most {max(figures['claims'] for figures in rounds)}"
        )


def main() -> None:
    """Parse the arguments, start the services, run the bench."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=30.0, help="triggers per second")
    parser.add_argument("--backlog", type=int, default=20_000)
    parser.add_argument("--quiet", type=float, default=5.0, help="seconds with no backlog")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--statement", type=float, default=0.2, help="seconds of pg_sleep")
    parser.add_argument("--ack-delay", type=float, default=0.0, help="seconds per wave")
    parser.add_argument("--mark-delay", type=float, default=0.0, help="seconds per mark")
    parser.add_argument("--shares", default="bounded,whole")
    args = parser.parse_args()
    args.shares = args.shares.split(",")
    if args.ack_delay:
        LateAcks.delay = args.ack_delay
        setattr(_pod_relay, "KafkaSender", LateAcks)  # noqa: B010 - the pod's relay's sender
    with contextlib.ExitStack() as stack:
        services = stack.enter_context(LocalStack())
        services.start("redis", "kafka", "postgres")
        anyio.run(bench, services, args)


if __name__ == "__main__":
    main()
