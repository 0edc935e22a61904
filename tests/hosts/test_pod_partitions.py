"""A pod on a host of its own, cut apart from its Redis: it stops before the other pod takes over.

Six hosts on one bridge: Redis, Kafka, PostgreSQL (the completion store) and
two pods (``leaseworker run`` of the takeover trials' :class:`CpuReport`, each
in a consumer group of its own so both receive every trigger, a 3 s lease).
A trigger's first execution computes in a child process through
``ctx.run_in_process``, marking on the monotonic clock every process here
shares (namespaces do not change clocks). Once it
marked for a while, its pod's host is cut: from Redis only (Kafka and the
store still reached), from everything, or with Redis's replies lost one way
(its requests still arrive: a renewal may be applied that the pod never hears
of). The other pod starts the key once Redis lets it.

Judged from clocks, not from what the holder logged: its code ran until its
last mark and its child until the kernel said it exited (a pidfd); both are
before the other pod's acquire was answered, and before Redis could first
expire the key by the holder's own record.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import anyio
import pytest
from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]

from leaseworker.toolkit import create_topics
from leaseworker_dev._campaign._takeover import LEASE, POD_FLAGS, TOPIC_VARIABLE
from leaseworker_dev._services import (
    MARKS_VARIABLE,
    ExitWatch,
    Host,
    Hosts,
    LocalKafka,
    LocalPostgres,
    LocalRedis,
    PodProcess,
    executions_of,
    first_expiry,
    pod_process,
    read_marks,
    until_committed,
    until_found,
    until_ready,
)

T = TypeVar("T")
COMPUTE = 4 * LEASE
"""Seconds the key's first execution would compute: the cut must stop it."""


@dataclass
class Bed:
    """The hosts, the services on them, the two pods and the trigger producer."""

    hosts: Hosts
    redis: LocalRedis
    kafka: LocalKafka
    store: LocalPostgres
    pods: dict[str, PodProcess]
    groups: list[str]
    topic: str
    marks: Path
    sent: int = 0


@pytest.fixture(scope="module")
def services(hosts: Hosts) -> Iterator[tuple[LocalRedis, LocalKafka, LocalPostgres]]:
    """Redis, Kafka and PostgreSQL, each on a host of its own, for the module."""
    with contextlib.ExitStack() as stack:
        redis = LocalRedis.start(place=hosts.add("redis").place)
        stack.callback(redis.stop)
        store = LocalPostgres.start(place=hosts.add("store").place)
        stack.callback(store.stop)
        kafka = LocalKafka.start(place=hosts.add("kafka").place)
        stack.callback(kafka.stop)
        yield redis, kafka, store


@pytest.fixture(scope="module")
def bed(
    hosts: Hosts,
    services: tuple[LocalRedis, LocalKafka, LocalPostgres],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Bed]:
    """Two pods, each on a host of its own, ready with their partition; stopped after the module.

    Sync (its async steps on a loop of their own): the tests' loops are theirs alone.
    """
    redis, kafka, store = services
    workdir = tmp_path_factory.mktemp("partitions")
    topic = f"partitions-{secrets.token_hex(3)}"
    anyio.run(lambda: create_topics(kafka.bootstrap_servers, [topic], partitions=1))
    env = {
        TOPIC_VARIABLE: topic,
        MARKS_VARIABLE: str(workdir / "marks"),
        "LEASEWORKER_STORE_URL": store.url,
    }
    pods: dict[str, PodProcess] = {}
    try:
        for name in ("pod-a", "pod-b"):
            group = ("--group", f"{topic}-{name}")
            pods[name] = pod_process(
                name,
                "leaseworker_dev._campaign._takeover:CpuReport",
                workdir=workdir,
                redis_url=redis.url,
                flags=[*("--bootstrap-servers", kafka.bootstrap_servers), *group, *POD_FLAGS],
                env={**env, "LEASEWORKER_NAMESPACE": topic},
                place=hosts.add(name).place,
            ).start()
        anyio.run(lambda: until_ready(list(pods.values()), within=120, partitions=True))
        groups = [f"{topic}-{name}" for name in pods]
        yield Bed(hosts, redis, kafka, store, pods, groups, topic, workdir / "marks")
    finally:
        for pod in pods.values():
            anyio.run(pod.stop, 10.0)


def _redis_only(bed: Bed, holder: Host) -> None:
    bed.hosts.cut(holder, bed.hosts["redis"])


def _everything(bed: Bed, holder: Host) -> None:
    bed.hosts.isolate(holder)


def _replies_lost(bed: Bed, holder: Host) -> None:
    bed.hosts.cut_one_way(bed.hosts["redis"], holder)


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "cut", [_redis_only, _everything, _replies_lost], ids=["redis-only", "everything", "one-way"]
)
async def test_the_cut_pods_code_ends_before_the_other_pod_takes_the_key(
    bed: Bed, cut: Callable[[Bed, Host], None]
) -> None:
    """The holder's child is dead and its last mark made before the other pod's acquire.

    Both also fall before Redis could first expire the holder's key (its
    recorded last renewal plus the lease). Cut from Redis only, the holder
    still reaches Kafka and the store (connects succeed while it is cut).
    """
    key = f"cut-{secrets.token_hex(3)}"
    await _send(bed, key, {"seconds": COMPUTE, "where": "process"})
    first = (
        await until_found(
            lambda: executions_of(list(bed.pods.values()), key)[:1],
            within=60,
            what="the first start",
        )
    )[0]
    holder = bed.pods[first.pod]
    taker = next(pod for pod in bed.pods.values() if pod is not holder)
    marks = bed.marks / f"{key}.{first.execution_id}"
    pid = await until_found(
        lambda: _child(marks, holder), within=30, what="the holder's child marks"
    )
    with ExitWatch() as watch:
        assert watch.add(pid)
        cut(bed, bed.hosts[holder.name])
        try:
            if cut is _redis_only:
                cut_off = bed.hosts[holder.name]
                for name, port in (("kafka", bed.kafka.port), ("store", bed.store.port)):
                    assert bed.hosts.reach(cut_off, bed.hosts[name], port, 1.0) == "open"
                assert bed.hosts.reach(cut_off, bed.hosts["redis"], bed.redis.port, 0.3) == "silent"
            taken = await until_found(
                lambda: [
                    e for e in executions_of(list(bed.pods.values()), key) if e.pod == taker.name
                ],
                within=COMPUTE + 30,
                what="the takeover",
            )
            ended = await until_found(
                lambda: [
                    e
                    for e in executions_of(list(bed.pods.values()), key)
                    if e.execution_id == first.execution_id and e.end is not None
                ],
                within=COMPUTE + 30,
                what="the holder's end",
            )
        finally:
            bed.hosts.heal()
        exited = await anyio.to_thread.run_sync(lambda: watch.exited(pid, within=5))
    assert exited is not None, "the holder's child still runs 5 s after its execution ended"
    last_mark = max(max(at) for at in read_marks(marks).values())
    took = taken[0].start
    ran_until = max(last_mark, exited)
    assert ran_until < took, f"the holder's code ran {ran_until - took:.3f}s into the takeover"
    expires = first_expiry(ended[0])
    assert expires is not None, ended[0]
    assert ran_until < expires, f"the holder's code ran {ran_until - expires:.3f}s past expiry"
    assert ended[0].outcome == "lost", ended[0]
    print(f"{cut.__name__}: holder stopped {(took - ran_until) * 1000:.0f} ms before the takeover")
    await until_committed(bed.kafka.bootstrap_servers, bed.groups, bed.topic, bed.sent, within=120)


async def _send(bed: Bed, key: str, payload: dict[str, object]) -> None:
    """Send one trigger of ``key`` (acknowledged by the broker)."""
    producer = AIOKafkaProducer(bootstrap_servers=bed.kafka.bootstrap_servers, acks="all")
    with anyio.fail_after(30):
        await producer.start()
        try:
            await producer.send_and_wait(
                bed.topic, key=key.encode(), value=json.dumps(payload).encode()
            )
        finally:
            await producer.stop()
    bed.sent += 1


def _child(marks: Path, holder: PodProcess) -> int:
    """The pid of the holder's child once it marked for half a second, else 0."""
    for pid, at in read_marks(marks).items():
        if pid != holder.process.pid and at[-1] - at[0] >= 0.5:
            return pid
    return 0
