"""The paused worker: two real ``leaseworker run`` pods, one SIGSTOPped past its lease.

A lease cannot stop a process that is not running. Pod A takes the job and
starts; its job then keeps the event loop busy (a synchronous wait: no await,
so no renewal, no cancellation) and the test SIGSTOPs the whole process past
its lease. Pod B takes the job key over with a newer request (a higher fence)
and completes it. A is SIGCONTed and, without awaiting anything first,
completes: nothing on A's side has noticed the loss yet, so only the
destination can refuse the late write, and it does: ``stale``. The later
tests (issue 22) wake A while B has claimed the job key and not completed,
or after B crashed having claimed it: the claim alone makes A ``stale``.

Each pod consumes its own topic (and group), so the test decides which pod
gets which trigger; they share the Redis namespace (one lease and fence per
job key) and the completion store, PostgreSQL or a SQLite file (WAL).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import anyio
import psycopg
import pytest
from redis.asyncio import Redis

from leaseworker import CompletionStore, JobContext, RedisLeases, ReportJob
from leaseworker._execution import completion_key
from leaseworker_dev._services import LocalKafka, LocalRedis, PodProcess

from ..kafka_util import committed, produce
from ..pods import ready, spawn
from ..waiting import eventually

LEASE = 2.0


class PausableJob(ReportJob):
    """Completes ``{"pod", "fence"}`` through ``ctx.complete``; marks what it saw.

    After its last checkpoint, with ``wait_for`` in the payload it waits
    *synchronously* until that file exists: a job that never awaits, like one
    stuck in a blocking call. With ``hold_until`` it waits for that file
    *asynchronously* (its lease renewing meanwhile): a newer holder that has
    started and not yet completed.
    Marker lines (``$LW_TEST_MARKERS``): ``start <pod> <fence>``, ``blocked <pod>
    <fence>`` (the synchronous wait begins) and ``complete <pod> <status> <fence>
    <winning fence>``.
    """

    topic = os.environ.get("LW_TEST_TOPIC", "unset")
    lease_duration = LEASE

    async def run(self, ctx: JobContext) -> object:
        """Mark the start, maybe block the loop, complete, mark the store's answer."""
        _mark(f"start {ctx.pod} {ctx.fence}")
        hold_until = ctx.trigger.payload.get("hold_until")
        if isinstance(hold_until, str):
            # Another process creates the file: no in-process event can say so.
            while not os.path.exists(hold_until):  # noqa: ASYNC240, ASYNC110
                await anyio.sleep(0.02)
        await ctx.checkpoint()  # the last one: past it, nothing on this side notices a loss
        wait_for = ctx.trigger.payload.get("wait_for")
        if isinstance(wait_for, str):
            # Past its last checkpoint: a pause from here on goes unnoticed until it completes
            # (a pause before it would end the execution lost, at the checkpoint).
            _mark(f"blocked {ctx.pod} {ctx.fence}")
            while not os.path.exists(wait_for):  # noqa: ASYNC240 - blocking on purpose
                time.sleep(0.01)  # noqa: ASYNC251 - the point: a job that does not await
        answer = await ctx.complete({"pod": ctx.pod, "fence": ctx.fence})
        _mark(f"complete {ctx.pod} {answer.status} {answer.fence} {answer.winning_fence}")
        return None


def _mark(line: str) -> None:
    with open(os.environ["LW_TEST_MARKERS"], "a") as markers:
        markers.write(line + "\n")


def _spawn(name: str, workdir: Path, topic: str, argv: list[str]) -> PodProcess:
    markers = {"LW_TEST_TOPIC": topic, "LW_TEST_MARKERS": str(workdir / "markers.txt")}
    return spawn(name, f"{__name__}:PausableJob", workdir, markers, *argv, evidence=True)


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
            return all([await ready(pod) for pod in pods.values()])

        await eventually(joined, within=45)
        request_a = {"inputVersion": "request-a", "wait_for": str(go)}
        await produce(bootstrap, topics["pod-a"], [(key.encode(), json.dumps(request_a).encode())])

        async def a_blocked() -> bool:
            return any(m[:2] == ["blocked", "pod-a"] for m in _marks(tmp_path))

        await eventually(a_blocked, within=20)
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


class Scene:
    """Pods that share Redis and the completion store, each on a topic (and group) of its own.

    ``spawn`` starts a pod on a named topic; ``send`` produces one request for
    the job key on it; ``started``/``answered`` read the job's markers; ``close``
    resumes and stops every pod it started.
    """

    def __init__(self, kafka: LocalKafka, redis_url: str, store_url: str, workdir: Path) -> None:
        suffix = uuid.uuid4().hex[:10]
        self.namespace, self.key = f"t{suffix}", "report:acme:2026-11"
        self.suffix = suffix
        self.kafka = kafka
        self.workdir = workdir
        self.common = [
            *("--bootstrap-servers", kafka.bootstrap_servers, "--redis-url", redis_url),
            *("--namespace", self.namespace, "--store-url", store_url),
        ]
        self.pods: list[PodProcess] = []

    def topic(self, name: str) -> str:
        """The topic of the pods called ``name`` (a restarted pod reuses it and its group)."""
        return f"claim-{name}-{self.suffix}"

    async def spawn(self, name: str, topic_of: str, *extra: str) -> PodProcess:
        """Start pod ``name`` on ``topic_of``'s topic and group; wait until it has its partition."""
        topic = self.topic(topic_of)
        self.kafka.create_topics([topic], exist_ok=True)  # a restarted pod reuses it
        argv = [*self.common, "--pod", name, "--group", f"g-{topic}", *extra]
        pod = _spawn(name, self.workdir, topic, argv)
        self.pods.append(pod)

        async def joined() -> bool:
            return await ready(pod)

        await eventually(joined, within=45)
        return pod

    async def send(self, topic_of: str, **payload: str) -> None:
        """Produce one request for the job key on ``topic_of``'s topic."""
        value = json.dumps(payload).encode()
        await produce(
            self.kafka.bootstrap_servers, self.topic(topic_of), [(self.key.encode(), value)]
        )

    def started(self, pod: str) -> list[int]:
        """Fences of ``pod``'s executions that reached ``run``."""
        return [int(m[2]) for m in _marks(self.workdir) if m[:2] == ["start", pod]]

    def blocked(self, pod: str) -> list[int]:
        """Fences of ``pod``'s executions that began the synchronous wait (past the checkpoint)."""
        return [int(m[2]) for m in _marks(self.workdir) if m[:2] == ["blocked", pod]]

    def answered(self, pod: str) -> list[list[str]]:
        """``[status, fence, winning fence]`` of each of ``pod``'s completions."""
        return [m[2:] for m in _marks(self.workdir) if m[:2] == ["complete", pod]]

    async def until(self, check: Callable[[], bool], within: float = 20) -> None:
        """Wait until ``check()`` holds (markers and logs are files: polled)."""

        async def holds() -> bool:
            return check()

        await eventually(holds, within=within)

    async def close(self) -> None:
        """Resume stopped pods, stop all, kill what did not exit."""
        for pod in self.pods:
            if pod.process.poll() is None:
                pod.signal(signal.SIGCONT)  # a stopped process cannot handle SIGTERM
                pod.signal(signal.SIGTERM)
        with anyio.move_on_after(20):
            for pod in self.pods:
                await pod.wait_exit(20)
        for pod in self.pods:
            pod.kill()


@pytest.fixture
async def scene(
    kafka_server: LocalKafka, redis_server: LocalRedis, store_url: str, tmp_path: Path
) -> AsyncIterator[Scene]:
    """A :class:`Scene` on the session's Kafka and Redis and this test's store."""
    opened = Scene(kafka_server, redis_server.url, store_url, tmp_path)
    try:
        yield opened
    finally:
        await opened.close()


async def _pause_a_past_its_lease(scene: Scene, redis: Redis, go: Path) -> PodProcess:
    """Start pod A's execution, freeze A after its last checkpoint, wait for its lease to expire."""
    a = await scene.spawn("pod-a", "a", "--session-timeout", "30")  # the pause: no rebalance
    await scene.send("a", inputVersion="request-a", wait_for=str(go))
    await scene.until(lambda: bool(scene.blocked("pod-a")))
    a.signal(signal.SIGSTOP)
    lease_key = RedisLeases(redis, namespace=scene.namespace).lease_key(scene.key)

    async def a_lease_expired() -> bool:
        return not await redis.exists(lease_key)

    await eventually(a_lease_expired, within=LEASE + 2)
    return a


async def test_a_paused_pod_that_wakes_before_the_new_holder_completes_gets_stale(
    scene: Scene, redis: Redis, store: CompletionStore
) -> None:
    """Issue 22's reproduction: B has claimed and is still running when A wakes and completes.

    A gets ``stale`` (winning fence: B's claim) and nothing of A's is stored,
    although B has written nothing yet; then B completes and is ``accepted``.
    """
    go, release_b = scene.workdir / "go", scene.workdir / "release-b"
    a = await _pause_a_past_its_lease(scene, redis, go)
    await scene.spawn("pod-b", "b")
    await scene.send("b", inputVersion="request-b", hold_until=str(release_b))
    await scene.until(lambda: bool(scene.started("pod-b")))  # run began: B's claim is stored
    go.touch()
    a.signal(signal.SIGCONT)
    await scene.until(lambda: bool(scene.answered("pod-a")))
    [fence_a], [fence_b] = scene.started("pod-a"), scene.started("pod-b")
    assert fence_b > fence_a
    assert scene.answered("pod-a") == [["stale", str(fence_a), str(fence_b)]]
    stored = completion_key(scene.namespace, scene.key)
    assert await store.lookup(stored, "request-a") is None
    assert await store.state(stored) is None  # B has not completed: nothing stored at all
    await scene.until(lambda: "lost (stale)" in a.log_text(), within=10)
    release_b.touch()
    await scene.until(lambda: bool(scene.answered("pod-b")))
    assert scene.answered("pod-b") == [["accepted", str(fence_b), str(fence_b)]]
    state = await store.state(stored)
    assert state is not None
    assert (state.pod, state.fence, state.input_version) == ("pod-b", fence_b, "request-b")
    assert ": completed" not in a.log_text()


async def test_a_new_holder_that_crashes_after_claiming_still_fences_and_its_trigger_completes(
    scene: Scene, redis: Redis, store: CompletionStore
) -> None:
    """B claims, then is killed before completing: A, waking after, is still ``stale``.

    B's trigger was never committed, so B's restarted pod gets it again; that
    execution acquires a higher fence, claims, completes and is ``accepted``.
    """
    go, release_b = scene.workdir / "go", scene.workdir / "release-b"
    a = await _pause_a_past_its_lease(scene, redis, go)
    b = await scene.spawn("pod-b", "b", "--session-timeout", "3")
    await scene.send("b", inputVersion="request-b", hold_until=str(release_b))
    await scene.until(lambda: bool(scene.started("pod-b")))
    b.kill()
    go.touch()
    a.signal(signal.SIGCONT)
    await scene.until(lambda: bool(scene.answered("pod-a")))
    [fence_a], [fence_b] = scene.started("pod-a"), scene.started("pod-b")
    assert scene.answered("pod-a") == [["stale", str(fence_a), str(fence_b)]]
    stored = completion_key(scene.namespace, scene.key)
    assert await store.state(stored) is None
    release_b.touch()
    await scene.spawn("pod-b2", "b", "--session-timeout", "3")
    await scene.until(lambda: bool(scene.answered("pod-b2")), within=40)
    [fence_c] = scene.started("pod-b2")
    assert fence_c > fence_b
    assert scene.answered("pod-b2") == [["accepted", str(fence_c), str(fence_c)]]
    state = await store.state(stored)
    assert state is not None
    assert (state.pod, state.fence, state.input_version) == ("pod-b2", fence_c, "request-b")
    assert await store.lookup(stored, "request-a") is None


async def test_a_claim_that_fails_keeps_the_job_from_starting_until_the_store_answers(
    scene: Scene, store_url: str
) -> None:
    """The store refuses writes (a lock held elsewhere): the pod never runs the job unfenced.

    The duplicate lookup (a read) still answers, the claim (a write) times
    out: the execution ends ``lost`` (``store_unavailable``) before ``run``
    and is retried. Once the lock is gone the next execution claims, runs and
    completes.
    """
    pod = await scene.spawn("pod-a", "a", "--store-timeout", "1")
    with _writes_blocked(store_url):
        await scene.send("a", inputVersion="request-a")
        await scene.until(lambda: pod.log_text().count("does not start unfenced") >= 2)
        assert scene.started("pod-a") == []
        assert "lost (store_unavailable)" in pod.log_text()
    await scene.until(lambda: bool(scene.answered("pod-a")))
    [fence] = scene.started("pod-a")
    assert scene.answered("pod-a") == [["accepted", str(fence), str(fence)]]


@contextlib.contextmanager
def _writes_blocked(store_url: str) -> Iterator[None]:
    """Hold the store's write lock from another connection: reads go on, writes wait.

    PostgreSQL: ``LOCK TABLE leaseworker_jobs IN EXCLUSIVE MODE`` (plain
    reads still allowed) in an open transaction; SQLite: ``BEGIN IMMEDIATE``
    (WAL readers are not blocked).
    """
    if store_url.startswith("sqlite:///"):
        conn = sqlite3.connect(store_url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            yield
        finally:
            conn.close()
        return
    with psycopg.connect(store_url) as pg:
        pg.execute("LOCK TABLE leaseworker_jobs IN EXCLUSIVE MODE")
        yield
        pg.rollback()
