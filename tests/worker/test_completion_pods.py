"""The paused worker: two real ``leaseworker run`` pods, one SIGSTOPped past its lease.

A lease cannot stop a process that is not running. Pod A takes the job and
starts; its job then keeps the event loop busy (a synchronous wait: no await,
so no renewal, no cancellation) and the test SIGSTOPs the whole process past
its lease. Pod B takes the job key over with a newer request (a higher fence)
and completes it. A is SIGCONTed and, without awaiting anything first,
completes: nothing on A's side has noticed the loss yet, so only the
destination can refuse the late write, and it does: ``stale``.

Each pod consumes its own topic (and group), so the test decides which pod
gets which trigger; they share the Redis namespace (one lease and fence per
job key) and the completion store, PostgreSQL or a SQLite file (WAL).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import anyio
from redis.asyncio import Redis

from leaseworker import CompletionStore, JobContext, RedisLeases, ReportJob
from leaseworker._dev._services import LocalRedis
from leaseworker._dev._services._kafka import LocalKafka
from leaseworker._execution._completion import completion_key

from ..kafka_util import committed, produce
from ..pods import LEASEWORKER, REPO, Pod
from ..waiting import eventually

LEASE = 2.0


class PausableJob(ReportJob):
    """Completes ``{"pod", "fence"}`` through ``ctx.complete``; marks what it saw.

    With ``wait_for`` in the payload it first waits *synchronously* until that
    file exists: a job that never awaits, like one stuck in a blocking call.
    Marker lines (``$LW_TEST_MARKERS``): ``start <pod> <fence>`` and
    ``complete <pod> <status> <fence> <winning fence>``.
    """

    topic = os.environ.get("LW_TEST_TOPIC", "unset")
    lease_duration = LEASE

    async def run(self, ctx: JobContext) -> object:
        """Mark the start, maybe block the loop, complete, mark the store's answer."""
        _mark(f"start {ctx.pod} {ctx.fence}")
        wait_for = ctx.trigger.payload.get("wait_for")
        if isinstance(wait_for, str):
            while not os.path.exists(wait_for):  # noqa: ASYNC240 - blocking on purpose
                time.sleep(0.01)  # noqa: ASYNC251 - the point: a job that does not await
        answer = await ctx.complete({"pod": ctx.pod, "fence": ctx.fence})
        _mark(f"complete {ctx.pod} {answer.status} {answer.fence} {answer.winning_fence}")
        return None


def _mark(line: str) -> None:
    with open(os.environ["LW_TEST_MARKERS"], "a") as markers:
        markers.write(line + "\n")


def _spawn(name: str, workdir: Path, topic: str, argv: list[str]) -> Pod:
    log = workdir / f"{name}.log"
    env = {
        **os.environ,
        "LW_TEST_TOPIC": topic,
        "LW_TEST_MARKERS": str(workdir / "markers.txt"),
        "PYTHONUNBUFFERED": "1",
    }
    with log.open("wb") as out:
        process = subprocess.Popen(
            [LEASEWORKER, "--log-level", "INFO", "run", f"{__name__}:PausableJob", *argv],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Pod(name, process, log)


def _marks(workdir: Path) -> list[list[str]]:
    path = workdir / "markers.txt"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


async def test_a_paused_pod_that_wakes_after_a_takeover_gets_stale_and_the_newer_result_stays(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    redis: Redis,
    store_url: str,
    store: CompletionStore,
    tmp_path: Path,
) -> None:
    """Invariant 5: A's late completion is refused (stale); B's result is what is stored.

    A is reported ``lost`` with reason ``stale`` (not completed) and its
    trigger is committed (B's newer completion is durable: not retried).
    Parametrized over PostgreSQL and a SQLite file shared by both processes.
    """
    suffix = uuid.uuid4().hex[:10]
    namespace, key = f"t{suffix}", "report:acme:2026-11"
    topics = {"pod-a": f"paused-a-{suffix}", "pod-b": f"paused-b-{suffix}"}
    kafka_server.create_topics(list(topics.values()))
    bootstrap = kafka_server.bootstrap_servers
    common = [
        *("--bootstrap-servers", bootstrap, "--redis-url", redis_server.url),
        *("--namespace", namespace, "--store-url", store_url),
        *("--session-timeout", "30"),  # the pause must not turn into a rebalance
    ]
    pods = {
        name: _spawn(name, tmp_path, topic, [*common, "--pod", name, "--group", f"g-{topic}"])
        for name, topic in topics.items()
    }
    a = pods["pod-a"]
    go = tmp_path / "go"
    try:

        async def joined() -> bool:
            return all("partitions assigned" in pod.log_text() for pod in pods.values())

        await eventually(joined, within=45)
        request_a = {"inputVersion": "request-a", "wait_for": str(go)}
        await produce(bootstrap, topics["pod-a"], [(key.encode(), json.dumps(request_a).encode())])

        async def a_started() -> bool:
            return any(m[:2] == ["start", "pod-a"] for m in _marks(tmp_path))

        await eventually(a_started, within=20)
        a.signal(signal.SIGSTOP)
        lease_key = RedisLeases(redis, namespace=namespace).lease_key(key)

        async def a_lease_expired() -> bool:
            return not await redis.exists(lease_key)

        await eventually(a_lease_expired, within=LEASE + 2)
        request_b = {"inputVersion": "request-b"}
        await produce(bootstrap, topics["pod-b"], [(key.encode(), json.dumps(request_b).encode())])
        stored = completion_key(namespace, key)

        async def b_completed() -> bool:
            state = await store.state(stored)
            return state is not None and state.pod == "pod-b"

        await eventually(b_completed, within=20)
        go.touch()
        a.signal(signal.SIGCONT)

        async def a_answered() -> bool:
            return any(m[:2] == ["complete", "pod-a"] for m in _marks(tmp_path))

        await eventually(a_answered, within=20)

        async def a_reported() -> bool:
            return "lost (stale)" in a.log_text()

        await eventually(a_reported, within=10)

        async def a_committed() -> bool:
            found = await committed(bootstrap, f"g-{topics['pod-a']}", topics["pod-a"])
            return found == {0: 1}

        await eventually(a_committed, within=15)
    finally:
        if a.process.poll() is None:
            a.signal(signal.SIGCONT)  # a stopped process cannot handle SIGTERM
        for pod in pods.values():
            if pod.process.poll() is None:
                pod.signal(signal.SIGTERM)
        with anyio.move_on_after(20):
            for pod in pods.values():
                await pod.wait_exit(20)
        for pod in pods.values():
            pod.kill()
    marks = _marks(tmp_path)
    [(_, _, fence_a)] = [m for m in marks if m[:2] == ["start", "pod-a"]]
    [(_, _, fence_b)] = [m for m in marks if m[:2] == ["start", "pod-b"]]
    assert int(fence_b) > int(fence_a)
    [answer_a] = [m for m in marks if m[:2] == ["complete", "pod-a"]]
    assert answer_a[2:] == ["stale", fence_a, fence_b]
    assert ["complete", "pod-b", "accepted", fence_b, fence_b] in marks
    state = await store.state(completion_key(namespace, key))
    assert state is not None
    assert (state.pod, state.fence, state.input_version) == ("pod-b", int(fence_b), "request-b")
    assert state.result == {"pod": "pod-b", "fence": int(fence_b)}
    assert await store.lookup(completion_key(namespace, key), "request-a") is None
    log_a = a.log_text()
    assert f"fence {fence_a} < winning fence {fence_b}" in log_a
    assert ": completed" not in log_a
