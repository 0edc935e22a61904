"""Failovers measured: a broker killed, a store promoted, a rolling restart, the relay's backlog.

One three-broker KRaft Kafka (``LocalKafkaCluster``: replication factor 3,
``min.insync.replicas`` 2), one Redis and, for the store parts, a PostgreSQL
primary with a synchronous standby (``LocalPostgresPair``, the pod on its
multi-host URL). One in-process pod with no-op jobs consumes a one-partition
trigger topic fed by a steady stream (a trigger every ``--gap`` seconds,
``acks=all``, each a job key of its own); a hook notes, on one monotonic
clock, each execution's fence, the store's answers, each trigger's terminal
end, each offset commit and each rebalance. Parts (``--parts``):

- ``leader_kill``: the broker leading the trigger partition (not the
  group's coordinator) is SIGKILLed, and alternately the coordinator (not
  the leader; ``--victims``, ``both``: one broker that is both). Each kill
  has a fresh topic and group, placed as wanted, and a pod of its own.
  Takeover: from the kill to the first trigger *sent after it* completed,
  and to its offset committed by the pod; the group's rebalance (revoking
  to assigned) when one happens. The broker is started
  again and in sync before the next.
- ``promotion``: the primary's server SIGKILLed, the standby promoted at once
  (a failover manager's detection time comes on top). Takeover: from the kill
  to the first completion the store accepted after it; the promotion's own
  time beside it. Each repetition gives the pair a fresh standby and the pod
  a restart on the new URL first (not timed).
- ``rolling``: trigger-to-completion p50 / p99 (the send to the trigger's
  terminal end) while the three brokers restart one after the other, against
  a calm window of ``--calm`` seconds in the same round (alternating which
  comes first); the ratio is the round's.
- ``relay_drain``: the job publishes a message per trigger; a burst of
  ``--burst`` triggers, the primary killed once half are completed and the
  standby promoted. Backlog: the outbox rows committed but unsent at the
  kill, the time from the promotion until each of them was sent, and the
  rows committed meanwhile; the most rows unsent after the promotion and the
  time until the burst was done and all of it sent (sampled every 50 ms).

Nothing lost, checked by the bench (exit 1 otherwise): every trigger the
broker acknowledged has its completion (the Kafka parts: accepted exactly
once; the store parts: in the store after the promotions, at the fence the
store answered, at most one ``accepted``), the group's committed offset
reaches the topic's end, each key's fences strictly increase, every
completion acknowledged before a kill is on the promoted node, and every
outbox row reaches the topic (duplicates, which receivers drop by effect id,
are counted).

    .venv/bin/python bench/failover.py [--parts leader_kill,promotion,rolling,relay_drain]
        [--repeats 5] [--victims leader,coordinator] [--rounds 2] [--calm 30] [--gap 0.05]
        [--burst 2000]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import itertools
import logging
import math
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import anyio
import psycopg
from aiokafka import (  # type: ignore[import-untyped]
    AIOKafkaConsumer,
    AIOKafkaProducer,
    TopicPartition,
)
from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

from leaseworker import Event, ExecutionEvent, JobContext, Pod, PodConfig, ReportJob, SourceEvent
from leaseworker.effects import EffectEvent
from leaseworker_dev._services import (
    LocalKafkaCluster,
    LocalPostgresPair,
    LocalRedis,
    committed_total,
)

PARTS = ("leader_kill", "promotion", "rolling", "relay_drain")
VALUE = b'{"inputVersion": "v1"}'
"""Every trigger's payload: the job key (the record key) makes each trigger new."""
NAMESPACE = "failover"
EFFECT_ID = "leaseworker-effect-id"
JOB_KEY = "leaseworker-job-key"
WITHIN = 180.0
"""Seconds any one wait of the bench may take before it gives up (a failure, not a figure)."""


class Noop(ReportJob):
    """Returns at once: what is timed is the failover, not the work."""

    topic = "unset"

    async def run(self, ctx: JobContext) -> object:
        """Do nothing."""
        return None


class Publishing(ReportJob):
    """One outbox message per trigger, committed with the completion."""

    topic = "unset"
    out = "unset"

    async def run(self, ctx: JobContext) -> object:
        """Publish one message in the completion's transaction."""
        async with ctx.transaction() as tx:
            tx.publish(self.out, b'{"n": 1}', key=ctx.job_key)
            tx.complete(None)
        return None


@dataclass
class Ledger:
    """A hook noting, on the monotonic clock, what the pod did with each trigger."""

    fences: dict[str, list[int]] = field(default_factory=lambda: collections.defaultdict(list))
    answers: dict[str, list[tuple[str, int, float]]] = field(
        default_factory=lambda: collections.defaultdict(list)
    )
    done: dict[str, float] = field(default_factory=dict)
    commits: list[tuple[float, dict[int, int]]] = field(default_factory=list)
    group: list[tuple[str, float]] = field(default_factory=list)
    sent: collections.Counter[str] = field(default_factory=collections.Counter)
    changed: anyio.Event = field(default_factory=anyio.Event)

    def __call__(self, event: Event) -> None:
        """Note ``event`` if it is one the figures or the checks need."""
        now = time.monotonic()
        if isinstance(event, ExecutionEvent):
            key = event.job_key
            if event.event == "started" and event.fence is not None:
                self.fences[key].append(event.fence)
            elif event.event == "completion" and event.reason is not None:
                self.answers[key].append((event.reason, event.fence or 0, now))
            elif event.event == "finished" and event.terminal:
                self.done.setdefault(key, now)
        elif isinstance(event, SourceEvent):
            if event.name == "committed" and event.error is None and not event.rejected:
                offsets = {tp.partition: offset for tp, offset in (event.offsets or {}).items()}
                self.commits.append((now, offsets))
            elif event.name in ("revoking", "assigned"):
                self.group.append((event.name, now))
        elif isinstance(event, EffectEvent) and event.name == "sent" and event.effect_id:
            self.sent[event.effect_id] += 1
        self.changed.set()
        self.changed = anyio.Event()

    async def until(self, check: Callable[[], bool], what: str, within: float = WITHIN) -> None:
        """Wait until ``check()`` holds, looking again at each event (and every 0.2 s)."""
        try:
            with anyio.fail_after(within):
                while not check():
                    with anyio.move_on_after(0.2):
                        await self.changed.wait()
        except TimeoutError:
            raise TimeoutError(f"{what} within {within:.0f} s") from None

    def accepted(self, key: str) -> list[tuple[str, int, float]]:
        """``key``'s completions the store answered ``accepted``."""
        return [answer for answer in self.answers.get(key, []) if answer[0] == "accepted"]


@dataclass
class Stream:
    """Triggers on one topic: a steady one every ``gap`` seconds, or a burst; each key new."""

    bootstrap: str
    topic: str
    prefix: str
    sent: dict[str, float] = field(default_factory=dict)
    acked: dict[str, int] = field(default_factory=dict)
    failed: int = 0
    _n: int = 0

    async def steady(self, gap: float, stop: anyio.Event) -> None:
        """Send a trigger every ``gap`` seconds until ``stop``, then await every acknowledgement."""
        async with self._producer() as producer, anyio.create_task_group() as tg:
            while not stop.is_set():
                tg.start_soon(self._send, producer, self._next())
                with anyio.move_on_after(gap):
                    await stop.wait()

    async def burst(self, count: int) -> list[str]:
        """Send ``count`` triggers at once; return their keys once each is acknowledged."""
        keys = [self._next() for _ in range(count)]
        async with self._producer() as producer, anyio.create_task_group() as tg:
            for key in keys:
                tg.start_soon(self._send, producer, key)
        return keys

    def after(self, moment: float) -> list[str]:
        """Return the keys sent at or after ``moment`` (monotonic), in order."""
        return [key for key, at in self.sent.items() if at >= moment]

    def _next(self) -> str:
        self._n += 1
        return f"{self.prefix}:{self._n}"

    @contextlib.asynccontextmanager
    async def _producer(self) -> AsyncIterator[AIOKafkaProducer]:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True
        )
        with anyio.fail_after(60):
            await producer.start()
        try:
            yield producer
        finally:
            await producer.stop()

    async def _send(self, producer: AIOKafkaProducer, key: str) -> None:
        """Send until the broker acknowledges it (a failed try's record may exist too)."""
        self.sent[key] = time.monotonic()
        with anyio.fail_after(WITHIN):
            while True:
                try:
                    meta = await producer.send_and_wait(self.topic, key=key.encode(), value=VALUE)
                except KafkaError:
                    self.failed += 1
                    await anyio.sleep(0.5)
                    continue
                self.acked[key] = int(meta.offset)
                return


@contextlib.asynccontextmanager
async def running_pod(job: ReportJob, config: PodConfig, ledger: Ledger) -> AsyncIterator[Pod]:
    """Run an in-process pod with ``ledger`` as its only hook; stop it on leaving."""
    pod = Pod(job, config, observer=ledger)
    async with anyio.create_task_group() as tg:
        await tg.start(_serve, pod)
        try:
            yield pod
        finally:
            pod.stop()


async def _serve(pod: Pod, *, task_status: anyio.abc.TaskStatus[None]) -> None:
    await pod.run(task_status=task_status)


async def steady_state(ledger: Ledger, stream: Stream) -> None:
    """Wait until a trigger sent from now on has ended: the pod consumes."""
    since = time.monotonic()

    def flowing() -> bool:
        return any(key in ledger.done for key in stream.after(since))

    await ledger.until(flowing, "no trigger completed")


async def in_thread(call: Callable[[], object]) -> None:
    """Run a blocking service call in a worker thread (the pod's loop keeps running)."""
    await anyio.to_thread.run_sync(call)


def config_for(cluster: LocalKafkaCluster, redis_url: str, store_url: str, group: str) -> PodConfig:
    """Return the pod's configuration: the cluster, one namespace, the given store."""
    return PodConfig(
        bootstrap_servers=cluster.bootstrap_servers,
        redis_url=redis_url,
        group=group,
        pod="bench",
        namespace=NAMESPACE,
        concurrency=16,
        store_url=store_url,
    )


def percentile(values: Sequence[float], q: float) -> float:
    """Return the nearest-rank ``q`` quantile (0 < q <= 1) of ``values``."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summary(name: str, values: Sequence[float], unit: str = "s") -> str:
    """``name p50 x worst y (n=z)``; ``-`` for none."""
    if not values:
        return f"{name} - (n=0)"
    digits = 0 if unit == "rows" else 2
    return (
        f"{name} p50 {statistics.median(values):.{digits}f} {unit}"
        f" worst {max(values):.{digits}f} {unit} (n={len(values)})"
    )


class Lost(Exception):
    """Something acknowledged went missing: the bench exits 1."""


@dataclass
class Checks:
    """The nothing-lost findings of the run; any one fails it."""

    problems: list[str] = field(default_factory=list)

    def expect(self, holds: bool, problem: str) -> None:
        """Note ``problem`` unless ``holds``."""
        if not holds:
            self.problems.append(problem)
            print(f"  LOST: {problem}", flush=True)


async def end_offset(bootstrap: str, topic: str) -> int:
    """Return the trigger partition's end offset (every record written, acknowledged or not)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    with anyio.fail_after(30):
        await consumer.start()
        try:
            ends = await consumer.end_offsets([TopicPartition(topic, 0)])
        finally:
            await consumer.stop()
    return int(sum(ends.values()))


async def drained(
    ledger: Ledger, stream: Stream, cluster: LocalKafkaCluster, group: str, checks: Checks
) -> None:
    """Wait until every acknowledged trigger ended and the group committed the topic's end."""
    await ledger.until(
        lambda: all(key in ledger.done for key in stream.acked), "triggers left unfinished"
    )
    end = await end_offset(cluster.bootstrap_servers, stream.topic)
    committed = 0
    with anyio.move_on_after(60):
        while True:
            committed = await committed_total(cluster.bootstrap_servers, group, stream.topic)
            if committed >= end:
                break
            await anyio.sleep(0.2)
    checks.expect(committed >= end, f"{stream.topic}: committed {committed} of {end} records")


def check_fences(ledger: Ledger, keys: Sequence[str], checks: Checks) -> None:
    """Each key's executions took strictly increasing fences, in the order they started."""
    bad = [k for k in keys if any(a >= b for a, b in itertools.pairwise(ledger.fences[k]))]
    checks.expect(not bad, f"fences not increasing for {len(bad)} keys, e.g. {bad[:3]}")


# --- leader_kill ----------------------------------------------------------------------------


VICTIMS = ("leader", "coordinator", "both")
"""What a kill of ``leader_kill`` takes: the trigger partition's leader (not the group's
coordinator), the coordinator (not the leader), or one broker that is both."""


@dataclass(frozen=True)
class Kill:
    """One kill's figures (seconds from the kill)."""

    victim: int
    completed: float
    committed: float
    rebalance: float | None


async def leader_kill(
    cluster: LocalKafkaCluster, redis_url: str, args: argparse.Namespace, checks: Checks
) -> list[str]:
    """Kill each of ``--victims`` ``--repeats`` times, a fresh topic, group and pod each time."""
    kills: dict[str, list[Kill]] = collections.defaultdict(list)
    victims = args.victims.split(",")
    unknown = sorted(set(victims) - set(VICTIMS))
    if unknown:
        raise SystemExit(f"failover.py: error: unknown victim(s) {', '.join(unknown)}")
    totals = Totals()
    for rep in range(args.repeats):
        for kind in victims:
            kill = await _one_kill(cluster, redis_url, args, kind, checks, totals)
            kills[kind].append(kill)
            seen = "none" if kill.rebalance is None else f"{kill.rebalance:.2f} s"
            print(
                f"  {kind} {rep + 1}: broker {kill.victim} killed: next trigger completed in"
                f" {kill.completed:.2f} s, committed in {kill.committed:.2f} s; rebalance {seen}",
                flush=True,
            )
    lines = []
    for kind in victims:
        rebalances = [k.rebalance for k in kills[kind] if k.rebalance is not None]
        lines.append(
            f"leader_kill, {kind} killed: "
            + summary("to the next trigger completed", [k.completed for k in kills[kind]])
            + "; "
            + summary("to its offset committed", [k.committed for k in kills[kind]])
            + f"; a rebalance after {len(rebalances)} of {len(kills[kind])} kills"
            + (f" ({summary('revoking to assigned', rebalances)})" if rebalances else "")
        )
    lines.append(totals.line())
    return lines


async def _one_kill(
    cluster: LocalKafkaCluster,
    redis_url: str,
    args: argparse.Namespace,
    kind: str,
    checks: Checks,
    totals: Totals,
) -> Kill:
    """Run a pod on a topic and group of its own; kill ``kind`` mid-stream; start it again."""
    await in_thread(cluster.wait_in_sync)
    topic, leader, group, coordinator = await _placed(cluster, together=kind == "both")
    victim = coordinator if kind == "coordinator" else leader
    ledger, stream = Ledger(), Stream(cluster.bootstrap_servers, topic, topic)
    store = f"sqlite:///{args.workdir / (topic + '.sqlite3')}"
    job = type("Noop", (Noop,), {"topic": topic})()
    stop = anyio.Event()
    try:
        async with running_pod(job, config_for(cluster, redis_url, store, group), ledger):
            async with anyio.create_task_group() as tg:
                tg.start_soon(stream.steady, args.gap, stop)
                await steady_state(ledger, stream)
                killed = time.monotonic()
                await in_thread(functools.partial(cluster.kill, victim))
                after = time.monotonic()
                completed, committed = await _takeover(ledger, stream, killed, after)
                await steady_state(ledger, stream)
                stop.set()
            await drained(ledger, stream, cluster, group, checks)
    finally:
        await in_thread(functools.partial(cluster.up, victim))
    _kafka_checks(ledger, stream, checks)
    totals.add(ledger, stream)
    return Kill(victim, completed, committed, _rebalance(ledger, killed))


async def _placed(cluster: LocalKafkaCluster, *, together: bool) -> tuple[str, int, str, int]:
    """Create a topic and name a group whose coordinator leads it too (``together``) or not.

    Returns the topic, its leader, the group and its coordinator. Kafka places
    a group's coordinator by its name's hash and a new partition's leader by
    turns, so a few topics and names are tried; after a restart the
    coordinators may all sit on one broker.
    """
    for _ in range(10):
        topic = f"fo-kill-{uuid.uuid4().hex[:6]}"
        await in_thread(functools.partial(cluster.create_topics, [topic]))
        leader = await _leader(cluster, topic)
        for _ in range(5):
            group = f"fo-kill-{uuid.uuid4().hex[:6]}"
            coordinator = await anyio.to_thread.run_sync(cluster.coordinator, group)
            if (coordinator == leader) == together:
                return topic, leader, group, coordinator
    raise RuntimeError("no topic and group of those tried were placed as wanted")


async def _leader(cluster: LocalKafkaCluster, topic: str) -> int:
    """Return the node leading ``topic``, asking again while the answer names none yet."""
    with anyio.fail_after(30):
        while True:
            with contextlib.suppress(KeyError):  # the metadata lacks the new partition yet
                leader = await anyio.to_thread.run_sync(cluster.leader, topic)
                if leader >= 0:
                    return leader
            await anyio.sleep(0.2)


@dataclass
class Totals:
    """The nothing-lost counts over several pods' runs."""

    acknowledged: int = 0
    retried: int = 0
    completed: int = 0
    duplicates: int = 0

    def add(self, ledger: Ledger, stream: Stream) -> None:
        """Count one run's triggers and answers."""
        self.acknowledged += len(stream.acked)
        self.retried += stream.failed
        self.completed += sum(1 for k in stream.acked if ledger.accepted(k))
        self.duplicates += sum(1 for v in ledger.answers.values() for a in v if a[0] == "duplicate")

    def line(self) -> str:
        """Say the counts in one line."""
        return (
            f"  {self.acknowledged} triggers acknowledged ({self.retried} sends retried),"
            f" {self.completed} accepted once each; redeliveries answered duplicate:"
            f" {self.duplicates}"
        )


async def _takeover(
    ledger: Ledger, stream: Stream, killed: float, after: float
) -> tuple[float, float]:
    """Seconds from ``killed`` to the first trigger sent after ``after`` ending; to its commit."""

    def first_done() -> str | None:
        ended = [(ledger.done[k], k) for k in stream.after(after) if k in ledger.done]
        return min(ended)[1] if ended else None

    await ledger.until(lambda: first_done() is not None, "no trigger completed after the kill")
    key = first_done()
    assert key is not None
    await ledger.until(lambda: key in stream.acked, "the trigger was never acknowledged")
    offset = stream.acked[key]

    def commit_of() -> float | None:
        return next((at for at, offsets in ledger.commits if offsets.get(0, -1) > offset), None)

    await ledger.until(lambda: commit_of() is not None, "its offset was never committed")
    at = commit_of()
    assert at is not None
    return ledger.done[key] - killed, at - killed


def _rebalance(ledger: Ledger, since: float) -> float | None:
    """Seconds from the first ``revoking`` after ``since`` to the next ``assigned`` (None: none)."""
    revoking = next((at for name, at in ledger.group if name == "revoking" and at > since), None)
    if revoking is None:
        return None
    assigned = next((at for name, at in ledger.group if name == "assigned" and at > revoking), None)
    return None if assigned is None else assigned - revoking


def _kafka_checks(ledger: Ledger, stream: Stream, checks: Checks) -> None:
    """Every acknowledged trigger: one accepted completion; fences increasing."""
    keys = list(stream.acked)
    twice = [k for k in keys if len(ledger.accepted(k)) != 1]
    checks.expect(not twice, f"{len(twice)} triggers not accepted exactly once, e.g. {twice[:3]}")
    check_fences(ledger, keys, checks)


# --- rolling --------------------------------------------------------------------------------


async def rolling(
    cluster: LocalKafkaCluster, redis_url: str, args: argparse.Namespace, checks: Checks
) -> list[str]:
    """Run a calm window and a rolling restart per round; trigger-to-completion in each."""
    topic, group = f"fo-roll-{uuid.uuid4().hex[:6]}", f"fo-roll-{uuid.uuid4().hex[:6]}"
    await in_thread(lambda: cluster.create_topics([topic]))
    ledger, stream = Ledger(), Stream(cluster.bootstrap_servers, topic, topic)
    store = f"sqlite:///{args.workdir / (topic + '.sqlite3')}"
    job = type("Noop", (Noop,), {"topic": topic})()
    windows: list[tuple[int, str, float, float]] = []
    stop = anyio.Event()
    async with running_pod(job, config_for(cluster, redis_url, store, group), ledger):
        async with anyio.create_task_group() as tg:
            tg.start_soon(stream.steady, args.gap, stop)
            await steady_state(ledger, stream)
            for rnd in range(args.rounds):
                order = ("calm", "rolling") if rnd % 2 == 0 else ("rolling", "calm")
                for side in order:
                    await in_thread(cluster.wait_in_sync)
                    began = time.monotonic()
                    if side == "calm":
                        await anyio.sleep(args.calm)
                    else:
                        await in_thread(cluster.rolling_restart)
                    windows.append((rnd, side, began, time.monotonic()))
                    print(f"  round {rnd + 1}: {side} {time.monotonic() - began:.0f} s", flush=True)
            stop.set()
        await drained(ledger, stream, cluster, group, checks)
    _kafka_checks(ledger, stream, checks)
    lines = []
    ratios50, ratios99 = [], []
    pooled: dict[str, list[float]] = collections.defaultdict(list)
    for rnd in range(args.rounds):
        cells = {}
        for r, side, began, ended in windows:
            if r != rnd:
                continue
            lat = [ledger.done[k] - at for k, at in stream.sent.items() if began <= at < ended]
            pooled[side].extend(lat)
            cells[side] = (percentile(lat, 0.5), percentile(lat, 0.99), len(lat))
        (c50, c99, cn), (r50, r99, rn) = cells["calm"], cells["rolling"]
        ratios50.append(r50 / c50)
        ratios99.append(r99 / c99)
        lines.append(
            f"  round {rnd + 1}: calm p50 / p99 {c50 * 1e3:.0f} / {c99 * 1e3:.0f} ms (n={cn}),"
            f" rolling {r50 * 1e3:.0f} / {r99 * 1e3:.0f} ms (n={rn}):"
            f" {r50 / c50:.2f}x / {r99 / c99:.2f}x"
        )
    calm, roll = pooled["calm"], pooled["rolling"]
    lines.append(
        f"rolling: trigger-to-completion p50 / p99 {percentile(roll, 0.5) * 1e3:.0f} /"
        f" {percentile(roll, 0.99) * 1e3:.0f} ms (worst {max(roll):.2f} s, n={len(roll)})"
        f" against calm {percentile(calm, 0.5) * 1e3:.0f} / {percentile(calm, 0.99) * 1e3:.0f}"
        f" ms (n={len(calm)}); median of the rounds' ratios {statistics.median(ratios50):.2f}x"
        f" / {statistics.median(ratios99):.2f}x"
    )
    totals = Totals()
    totals.add(ledger, stream)
    lines.append(totals.line())
    return lines


# --- promotion and relay_drain --------------------------------------------------------------


async def query(url: str, sql: str) -> list[tuple[object, ...]]:
    """Run ``sql`` on whichever node ``url`` finds the primary; return its rows."""
    with anyio.fail_after(30):
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            cursor = await conn.execute(sql.encode())
            return list(await cursor.fetchall())


async def store_checks(
    url: str, ledger: Ledger, stream: Stream, before: set[str], checks: Checks
) -> None:
    """After the promotions: every acknowledged trigger completed, at its accepted fence, once.

    ``before``: keys whose completion the store acknowledged before a kill.
    """
    rows = await query(url, "SELECT job_key, fence FROM leaseworker_completions")
    stored = {str(key): int(str(fence)) for key, fence in rows}
    keys = list(stream.acked)
    missing = [k for k in keys if f"{NAMESPACE}:{{{k}}}" not in stored]
    checks.expect(not missing, f"{len(missing)} triggers have no completion, e.g. {missing[:3]}")
    lost = [k for k in before if f"{NAMESPACE}:{{{k}}}" not in stored]
    checks.expect(not lost, f"{len(lost)} acknowledged completions lost in a promotion")
    twice = [k for k in keys if len(ledger.accepted(k)) > 1]
    checks.expect(not twice, f"{len(twice)} triggers accepted twice, e.g. {twice[:3]}")
    moved = [
        k
        for k in keys
        if (found := ledger.accepted(k)) and stored.get(f"{NAMESPACE}:{{{k}}}") != found[0][1]
    ]
    checks.expect(not moved, f"{len(moved)} stored fences differ from the accepted one")
    check_fences(ledger, keys, checks)


@dataclass
class PairFailover:
    """The pair, its database, and one kill-and-promote with its times."""

    pair: LocalPostgresPair
    database: str
    killed: float = 0.0
    """When the kill was sent (monotonic): the figures' start."""
    dead: float = 0.0
    """When the primary's processes were gone: an answer after it came from the new primary."""
    promoted: float = 0.0

    @property
    def url(self) -> str:
        """The database's multi-host URL as the pair names its nodes now."""
        return self.pair.url_for(self.database)

    async def ready(self) -> None:
        """Give a promoted pair a fresh standby (before a repetition)."""
        if self.pair.standby is None:
            await in_thread(self.pair.rejoin)

    async def fail_over(self) -> None:
        """SIGKILL the primary's server and children, promote the standby at once."""
        self.killed = time.monotonic()
        await in_thread(self.pair.kill_primary)
        self.dead = time.monotonic()
        await in_thread(self.pair.promote)
        self.promoted = time.monotonic()


async def on_the_pair(
    cluster: LocalKafkaCluster, pair: LocalPostgresPair, prefix: str, *also: str
) -> tuple[str, str, PairFailover, Ledger, Stream]:
    """Return a part's own trigger topic, group, database on ``pair``, ledger and stream.

    ``also``: suffixes of more topics to create (``topic + suffix``).
    """
    topic, group = f"{prefix}-{uuid.uuid4().hex[:6]}", f"{prefix}-{uuid.uuid4().hex[:6]}"
    await in_thread(lambda: cluster.create_topics([topic, *(topic + suffix for suffix in also)]))
    failover = PairFailover(pair, f"fo{uuid.uuid4().hex[:8]}")
    await in_thread(lambda: pair.create_database(failover.database))
    return topic, group, failover, Ledger(), Stream(cluster.bootstrap_servers, topic, topic)


async def promotion(
    cluster: LocalKafkaCluster,
    redis_url: str,
    pair: LocalPostgresPair,
    args: argparse.Namespace,
    checks: Checks,
) -> list[str]:
    """Kill the primary and promote the standby ``--repeats`` times, the pod running through."""
    topic, group, failover, ledger, stream = await on_the_pair(cluster, pair, "fo-pg")
    job = type("Noop", (Noop,), {"topic": topic})()
    taken, promoting, before = [], [], set()
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(stream.steady, args.gap, stop)
        for rep in range(args.repeats):
            await failover.ready()
            config = config_for(cluster, redis_url, failover.url, group)
            async with running_pod(job, config, ledger):
                await steady_state(ledger, stream)
                before |= {k for k in ledger.answers if ledger.accepted(k)}
                await failover.fail_over()

                def first_after() -> float | None:
                    later = [
                        at
                        for answers in ledger.answers.values()
                        for status, _, at in answers
                        if status == "accepted" and at > failover.dead
                    ]
                    return min(later) if later else None

                await ledger.until(lambda: first_after() is not None, "nothing completed")
                at = first_after()
                assert at is not None
                taken.append(at - failover.killed)
                promoting.append(failover.promoted - failover.killed)
                print(
                    f"  promotion {rep + 1}: promoted in {promoting[-1]:.2f} s; next completion"
                    f" committed {taken[-1]:.2f} s after the kill",
                    flush=True,
                )
                await steady_state(ledger, stream)
        stop.set()
    await failover.ready()
    async with running_pod(job, config_for(cluster, redis_url, failover.url, group), ledger):
        await drained(ledger, stream, cluster, group, checks)
    await store_checks(failover.url, ledger, stream, before, checks)
    lost = sum(1 for v in ledger.answers.values() for a in v if a[0] != "accepted")
    return [
        "promotion: "
        + summary("kill to the next completion committed", taken)
        + "; "
        + summary("kill to promoted", promoting),
        f"  {len(stream.acked)} triggers acknowledged, each completed in the store;"
        f" answers other than accepted: {lost}",
    ]


async def relay_drain(
    cluster: LocalKafkaCluster,
    redis_url: str,
    pair: LocalPostgresPair,
    args: argparse.Namespace,
    checks: Checks,
) -> list[str]:
    """Send bursts of publishing triggers, the primary killed halfway; the backlog after."""
    topic, group, failover, ledger, stream = await on_the_pair(cluster, pair, "fo-relay", "-out")
    out = f"{topic}-out"
    job = type("Publishing", (Publishing,), {"topic": topic, "out": out})()
    at_kill, peaks, during, drains, dones, before = [], [], [], [], [], set()
    for rep in range(args.repeats):
        await failover.ready()
        async with running_pod(job, config_for(cluster, redis_url, failover.url, group), ledger):
            backlog, rows, burst = await _burst_and_kill(failover, ledger, stream, args.burst)
            before |= {k for k in ledger.answers if ledger.accepted(k)}
            drain = await _until_drained(failover, ledger, burst, backlog)
        at_kill.append(len(backlog))
        peaks.append(drain.peak)
        during.append(drain.rows - rows)
        drains.append(drain.sent - failover.promoted)
        dones.append(drain.done - failover.promoted)
        print(
            f"  relay {rep + 1}: {len(backlog)} rows unsent at the kill ({rows} committed so"
            f" far), all sent {drains[-1]:.2f} s after the promotion"
            f" ({drain.sent - failover.killed:.2f} s after the kill), {during[-1]} rows"
            f" committed since the kill; at most {drain.peak} unsent; the burst done and"
            f" sent {dones[-1]:.2f} s after the promotion",
            flush=True,
        )
    await failover.ready()
    async with running_pod(job, config_for(cluster, redis_url, failover.url, group), ledger):
        await drained(ledger, stream, cluster, group, checks)
    await store_checks(failover.url, ledger, stream, before, checks)
    delivered, duplicates = await _delivery(cluster, out, failover.url, checks)
    return [
        "relay_drain: "
        + summary("unsent at the kill", at_kill, "rows")
        + "; "
        + summary("promotion to those sent", drains)
        + "; "
        + summary("rows committed from the kill until then", during, "rows")
        + "; "
        + summary("most unsent after the promotion", peaks, "rows")
        + "; "
        + summary("promotion to the burst done and sent", dones),
        f"  {delivered} outbox rows, each on the topic; {duplicates} sent twice"
        " (receivers drop them by effect id)",
    ]


async def _burst_and_kill(
    failover: PairFailover, ledger: Ledger, stream: Stream, count: int
) -> tuple[list[int], int, list[str]]:
    """Send ``count`` triggers at once; once half completed, kill the primary and promote.

    Returns the ids of the outbox rows unsent just before the kill, how many
    rows the outbox held then, and the burst's keys (all acknowledged).
    """
    await stream.burst(1)  # the pod consumes: its group joined
    await ledger.until(lambda: all(k in ledger.done for k in stream.acked), "warm-up")
    burst: list[str] = []

    async def send() -> None:
        burst.extend(await stream.burst(count))

    def half() -> bool:
        return sum(1 for k in stream.after(start) if ledger.accepted(k)) >= count // 2

    async with anyio.create_task_group() as tg:
        start = time.monotonic()
        tg.start_soon(send)
        await ledger.until(half, "half the burst never completed")
        [(ids, rows)] = await query(failover.url, UNSENT)
        await failover.fail_over()
    return sorted(cast(list[int] | None, ids) or []), int(str(rows)), burst


UNSENT = (
    "SELECT (SELECT array_agg(id) FROM leaseworker_outbox_unsent),"
    " (SELECT count(*) FROM leaseworker_outbox)"
)


@dataclass(frozen=True)
class Drain:
    """The relay after a promotion, sampled every 50 ms on the new primary."""

    sent: float
    """When every row unsent at the kill had been sent (monotonic)."""
    rows: int
    """The rows the outbox held then."""
    peak: int
    """The most rows unsent, those committed after the kill included."""
    done: float
    """When the whole burst had completed and no row was unsent."""


async def _until_drained(
    failover: PairFailover, ledger: Ledger, burst: Sequence[str], backlog: Sequence[int]
) -> Drain:
    """Sample the unsent rows until the backlog is sent and the burst is done and sent."""
    ids = "{" + ",".join(str(i) for i in backlog) + "}"
    sample = (
        "SELECT (SELECT count(*) FROM leaseworker_outbox_unsent),"
        " (SELECT count(*) FROM leaseworker_outbox),"
        f" (SELECT count(*) FROM leaseworker_outbox_unsent WHERE id = ANY('{ids}'::bigint[]))"
    )
    peak, sent = 0, None
    with anyio.fail_after(WITHIN):
        while True:
            with contextlib.suppress(psycopg.Error):
                [(unsent, total, left)] = await query(failover.url, sample)
                count, now = int(str(unsent)), time.monotonic()
                peak = max(peak, count)
                if sent is None and int(str(left)) == 0:
                    sent = (now, int(str(total)))
                if sent is not None and count == 0 and all(k in ledger.done for k in burst):
                    return Drain(sent[0], sent[1], peak, now)
            await anyio.sleep(0.05)


async def _delivery(
    cluster: LocalKafkaCluster, out: str, url: str, checks: Checks
) -> tuple[int, int]:
    """Read ``out`` to its end: every outbox row's effect id on it; return (rows, duplicates)."""
    [(rows,)] = await query(url, "SELECT count(*) FROM leaseworker_outbox")
    [(unsent,)] = await query(url, "SELECT count(*) FROM leaseworker_outbox_unsent")
    checks.expect(int(str(unsent)) == 0, f"{unsent} outbox rows never sent")
    keys = {str(k) for (k,) in await query(url, "SELECT job_key FROM leaseworker_outbox")}
    seen: collections.Counter[str] = collections.Counter()
    by_key: set[str] = set()
    consumer = AIOKafkaConsumer(
        out, bootstrap_servers=cluster.bootstrap_servers, auto_offset_reset="earliest"
    )
    with anyio.fail_after(60):
        await consumer.start()
        try:
            while len(seen) < int(str(rows)):
                batch = await consumer.getmany(timeout_ms=2000)
                if not batch:
                    break
                for records in batch.values():
                    for record in records:
                        headers = dict(record.headers)
                        seen[headers[EFFECT_ID].decode()] += 1
                        by_key.add(headers[JOB_KEY].decode())
            with anyio.move_on_after(3):  # the duplicates past the last new one
                for records in (await consumer.getmany(timeout_ms=2000)).values():
                    for record in records:
                        seen[dict(record.headers)[EFFECT_ID].decode()] += 1
        finally:
            await consumer.stop()
    checks.expect(len(seen) == int(str(rows)), f"{len(seen)} of {rows} outbox rows on the topic")
    checks.expect(keys <= by_key, f"{len(keys - by_key)} job keys' messages not on the topic")
    return len(seen), sum(seen.values()) - len(seen)


# --- main -----------------------------------------------------------------------------------


async def bench(args: argparse.Namespace) -> int:
    parts = args.parts.split(",")
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        print(
            f"failover.py: error: unknown part(s) {', '.join(unknown)} (known: {', '.join(PARTS)})"
        )
        return 2
    print(f"load before: {_load()}", flush=True)
    checks, lines = Checks(), []
    with contextlib.ExitStack() as stack:
        cluster = await anyio.to_thread.run_sync(LocalKafkaCluster.start)
        stack.callback(cluster.stop)
        redis = LocalRedis.start()
        stack.callback(redis.stop)
        pair = None
        if {"promotion", "relay_drain"} & set(parts):
            pair = await anyio.to_thread.run_sync(LocalPostgresPair.start)
            stack.callback(pair.stop)
        for part in parts:
            print(f"{part}:", flush=True)
            if part == "leader_kill":
                lines += await leader_kill(cluster, redis.url, args, checks)
            elif part == "rolling":
                lines += await rolling(cluster, redis.url, args, checks)
            elif part == "promotion":
                assert pair is not None
                lines += await promotion(cluster, redis.url, pair, args, checks)
            else:
                assert pair is not None
                lines += await relay_drain(cluster, redis.url, pair, args, checks)
            print(f"  load now: {_load()}", flush=True)
    print()
    for line in lines:
        print(line)
    print(f"load after: {_load()}")
    if checks.problems:
        print(f"FAILED: {len(checks.problems)} losses (see LOST above)")
        return 1
    print("nothing lost")
    return 0


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} {five:.1f} {fifteen:.1f} ({os.cpu_count()} cores)"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--repeats", type=int, default=5, help="kills (per victim), promotions")
    parser.add_argument("--victims", default="leader,coordinator", help=", ".join(VICTIMS))
    parser.add_argument("--rounds", type=int, default=2, help="rolling: calm and rolling rounds")
    parser.add_argument("--calm", type=float, default=30.0, help="rolling: calm window, seconds")
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between triggers")
    parser.add_argument("--burst", type=int, default=2000, help="relay_drain: triggers at once")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    for noisy in ("aiokafka", "psycopg.pool"):  # a dead broker or primary, said each time
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="lw-failover-") as workdir:
        args.workdir = Path(workdir)
        sys.exit(anyio.run(bench, args))


if __name__ == "__main__":
    main()
