"""Triggers per second of one pod and of several pods on one consumer group.

Each pod is a process of its own (its own event loop), running an in-process
:class:`~leaseworker.Pod` with no-op jobs (bench/throughput.py's
``NoopReport``) against one private Kafka broker, Redis and completion store
(PostgreSQL by default). A round starts the pods on an empty topic, waits
until the group is stable with every pod in it, then produces the triggers;
the rate is timed from the first committed offset to the last, so process
start-up and the group join are left out. Rounds alternate the pod counts.
Each pod also reports its process CPU time per 1000 triggers it ran.

    .venv/bin/python bench/pod_scaling.py [--triggers 6000] [--rounds 3]
        [--concurrency 16] [--pods 1,2] [--store postgresql|sqlite]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import statistics
import tempfile
import time
import uuid
from multiprocessing.synchronize import Event as ProcessEvent
from pathlib import Path
from typing import Any

import anyio
from aiokafka.admin import AIOKafkaAdminClient  # type: ignore[import-untyped]
from throughput import PARTITIONS, NoopReport, produce

from leaseworker import ExecutionEvent, Pod, PodConfig
from leaseworker_dev._services._kafka import LocalKafka
from leaseworker_dev._services._local_stack import LocalStack


class Counter:
    """Observer counting finished executions."""

    def __init__(self) -> None:
        self.finished = 0

    def on_event(self, event: ExecutionEvent) -> None:
        """Count ``finished`` events."""
        if event.event == "finished":
            self.finished += 1


def pod_process(settings: dict[str, Any], stop: ProcessEvent, results: Any) -> None:
    """Run one pod until ``stop`` is set; put (CPU seconds, executions) on ``results``."""
    anyio.run(_pod, settings, stop, results)


async def _pod(settings: dict[str, Any], stop: ProcessEvent, results: Any) -> None:
    job = type("NoopReport", (NoopReport,), {"topic": settings.pop("topic")})()
    counter = Counter()
    worker = Pod(job, PodConfig(**settings), observer=counter)
    async with anyio.create_task_group() as tg:
        await tg.start(_serve, worker)
        cpu = time.process_time()
        await anyio.to_thread.run_sync(stop.wait)
        worker.stop()
    results.put((time.process_time() - cpu, counter.finished))


async def _serve(worker: Pod, *, task_status: anyio.abc.TaskStatus[None]) -> None:
    await worker.run(task_status=task_status)


async def group_stable(bootstrap: str, group: str, members: int) -> None:
    """Wait until ``group`` is Stable with ``members`` members."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    with anyio.fail_after(90):
        await admin.start()
        try:
            while True:
                [response] = await admin.describe_consumer_groups([group])
                _, _, state, _, _, joined = response.groups[0]
                if state == "Stable" and len(joined) == members:
                    return
                await anyio.sleep(0.1)
        finally:
            await admin.close()


async def committed_span(bootstrap: str, group: str, topic: str, count: int) -> float:
    """Poll committed offsets: return the rate from the first commit until all ``count``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    first: tuple[float, int] | None = None
    with anyio.fail_after(300):
        await admin.start()
        try:
            while True:
                offsets = await admin.list_consumer_group_offsets(group)
                total = sum(m.offset for tp, m in offsets.items() if tp.topic == topic)
                now = time.perf_counter()
                if first is None and total > 0:
                    first = (now, total)
                if first is not None and total >= count:
                    return (count - first[1]) / (now - first[0])
                await anyio.sleep(0.02)
        finally:
            await admin.close()


async def one_round(
    kafka: LocalKafka, base: dict[str, Any], pods: int, args: argparse.Namespace
) -> tuple[float, float]:
    """Run ``pods`` pods on a fresh topic; return (triggers/s, CPU ms per 1000 per pod)."""
    topic = f"scale-{uuid.uuid4().hex[:8]}"
    kafka.create_topics([topic], partitions=PARTITIONS)
    group = f"scale-{uuid.uuid4().hex[:8]}"
    # A namespace of the round's own: the triggers repeat identities across rounds,
    # which the store would otherwise answer as duplicates.
    fresh = {"topic": topic, "group": group, "namespace": f"scale-{uuid.uuid4().hex[:6]}"}
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    results = context.Queue()
    procs = [
        context.Process(
            target=pod_process,
            args=({**base, **fresh, "pod": f"pod-{n}"}, stop, results),
        )
        for n in range(pods)
    ]
    for proc in procs:
        proc.start()
    try:
        await group_stable(kafka.bootstrap_servers, group, pods)
        async with anyio.create_task_group() as tg:
            tg.start_soon(produce, kafka.bootstrap_servers, topic, args.triggers)
            rate = await committed_span(kafka.bootstrap_servers, group, topic, args.triggers)
    finally:
        stop.set()
        spent = [results.get(timeout=30) for _ in procs]
        for proc in procs:
            proc.join(timeout=30)
    cpu = sum(seconds for seconds, _ in spent) / max(1, sum(runs for _, runs in spent)) * 1e6
    return rate, cpu


async def bench(kafka: LocalKafka, base: dict[str, Any], args: argparse.Namespace) -> None:
    counts = [int(n) for n in args.pods.split(",")]
    rates: dict[int, list[float]] = {n: [] for n in counts}
    cpus: dict[int, list[float]] = {n: [] for n in counts}
    for round_no in range(args.rounds):
        for pods in counts if round_no % 2 == 0 else counts[::-1]:
            rate, cpu = await one_round(kafka, base, pods, args)
            rates[pods].append(rate)
            cpus[pods].append(cpu)
            print(f"  round {round_no + 1}: {pods} pod(s) {rate:8.0f} /s  {cpu:6.0f} ms CPU/1000")
    print()
    first = counts[0]
    for pods in counts:
        ratios = [r / b for r, b in zip(rates[pods], rates[first], strict=True)]
        print(
            f"median {pods} pod(s): {statistics.median(rates[pods]):8.0f} triggers/s"
            f" ({statistics.median(rates[pods]) / pods:.0f} per pod),"
            f" {statistics.median(cpus[pods]):5.0f} ms CPU/1000 per pod,"
            f" {statistics.median(ratios):.2f}x of {first} pod(s)"
            f" (range {min(ratios):.2f}-{max(ratios):.2f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--triggers", type=int, default=6000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--pods", default="1,2")
    parser.add_argument("--store", choices=("postgresql", "sqlite"), default="postgresql")
    args = parser.parse_args()
    print(
        f"{args.triggers} no-op triggers over {PARTITIONS} partitions, concurrency "
        f"{args.concurrency} per pod, {args.store} store, pods {args.pods}, {args.rounds} rounds"
    )
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lw-scale-")))
        services = stack.enter_context(LocalStack())
        services.start("redis", "kafka")  # PostgreSQL starts below if asked for
        redis_server, kafka = services.redis, services.kafka
        if args.store == "postgresql":
            store_url = services.postgres.create_database("scale")
        else:
            store_url = f"sqlite:///{workdir / 'completions.sqlite3'}"
        base = {
            "bootstrap_servers": kafka.bootstrap_servers,
            "redis_url": redis_server.url,
            "concurrency": args.concurrency,
            "store_url": store_url,
        }
        anyio.run(bench, kafka, base, args)


if __name__ == "__main__":
    main()
