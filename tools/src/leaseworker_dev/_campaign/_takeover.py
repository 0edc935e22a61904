"""Takeover trials of a CPU-bound job that never awaits: two real pods, one black-holed Redis.

Two ``leaseworker run`` pods of :class:`CpuReport`, each behind its own
Redis fault proxy and each in a consumer group of its own, so that both
receive every trigger and the second one takes the key over as soon as Redis
lets it (no rebalance in the measure). A trial sends one trigger of a new
key; the pod whose acquire wins (A) computes for several lease durations
without awaiting, in a child process through ``ctx.run_in_process`` or in
its event loop (the payload's ``where``); once A's code has marked for a
while, A's Redis is black-holed; the other pod (B) starts the key once Redis
lets it go. Healed, the next trial starts once both groups committed the
trigger.

A trial is judged from clocks, never from what A logged: A's code ran until
its last mark (``crunch``'s, on the monotonic clock every process here
shares) and, for a child, until the kernel said it exited (a pidfd); Redis
could expire A's key no earlier than A's recorded ``expires_at`` (the last
renewal's send time plus the lease), its local deadline is that less what
the default :class:`DeadlinePolicy` keeps back; B started when its acquire
was answered. ``bench/process_takeover.py`` runs fifty and more,
``tests/campaign/test_cpu_takeover.py`` a few.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]

from leaseworker.toolkit import (
    ChaosProxy,
    DeadlinePolicy,
    JobContext,
    ReportJob,
    create_topics,
)

from .._services import (
    MARKS_VARIABLE,
    ExitWatch,
    PodProcess,
    crunch,
    executions_of,
    first_expiry,
    marks_file,
    pod_process,
    read_marks,
    until_committed,
    until_found,
    until_ready,
)

Where = Literal["process", "loop"]
TOPIC_VARIABLE = "LEASEWORKER_TAKEOVER_TOPIC"
LEASE = 3.0
"""The job's lease duration, in seconds."""
COMPUTE = {"process": 4.0, "loop": 3.5}
"""How long the key's first execution computes, in lease durations (a takeover: 0.2 s).

In the loop, the other pod takes the key once A's Kafka session (6 s) ran out and
the group rebalanced: up to 7 s after the black-hole on a loaded machine, where 2.5
lease durations (7.5 s) left an overlap of 60 ms; 10.5 s leave it seconds.
"""
BLACKHOLE_AFTER = 0.5
"""Seconds A's code has computed (by its marks) when its Redis is black-holed."""
POD_FLAGS = (
    *("--concurrency", "1", "--redis-timeout", "0.5", "--session-timeout", "6"),
    *("--heartbeat-interval", "1", "--shutdown-timeout", "3", "--max-poll-interval", "30"),
)
Out = Callable[[str], None]


class CpuReport(ReportJob):
    """Compute without awaiting, in a child or in the event loop, marking as it goes.

    The key's first execution computes ``seconds`` (the payload's); any later
    one (the takeover, a retry) 0.2 s. ``leaseworker run`` builds it, so its
    topic comes from ``$LEASEWORKER_TAKEOVER_TOPIC``.
    """

    topic = os.environ.get(TOPIC_VARIABLE, "leaseworker.takeover")
    lease_duration = LEASE

    async def run(self, ctx: JobContext) -> object:
        """Run ``crunch`` where the payload says, its marks named by key and execution."""
        marks = marks_file(f"{ctx.job_key}.{ctx.execution_id}")
        earlier = any(Path(marks).parent.glob(f"{ctx.job_key}.*"))
        seconds = 0.2 if earlier else float(ctx.trigger.payload.get("seconds", 1.0))
        if ctx.trigger.payload.get("where") == "loop":
            return crunch(None, seconds, marks)  # the event loop is stuck here: no renewals
        return await ctx.run_in_process(crunch, seconds, marks)


@dataclass(frozen=True, slots=True, kw_only=True)
class Trial:
    """One trial's clocks (monotonic seconds) and what they say."""

    key: str
    where: Where
    holder: str
    taker: str
    acquired: float  # A's acquire answered
    blackholed: float
    last_mark: float  # A's code, the last time it marked
    exited: float | None  # A's child, as the kernel said (``None`` in the loop)
    lost: float | None  # A's recorded loss
    expires: float | None  # the earliest moment Redis could expire A's key
    taken: float  # B's acquire answered

    @property
    def ran_until(self) -> float:
        """The last moment A's code can have run: its last mark or its child's exit."""
        return max(self.last_mark, self.exited or self.last_mark)

    @property
    def overlap(self) -> float:
        """Seconds A's code ran after B had the key."""
        return max(0.0, self.ran_until - self.taken)

    @property
    def margin(self) -> float | None:
        """Seconds between A's code's end and the earliest expiry of its key (< 0: after)."""
        return None if self.expires is None else self.expires - self.ran_until

    @property
    def deadline_margin(self) -> float | None:
        """Seconds between A's code's end and A's local deadline (< 0: after it)."""
        if self.expires is None:
            return None
        deadline: float = self.expires - LEASE + DeadlinePolicy().validity(LEASE)
        return deadline - self.ran_until

    def line(self) -> str:
        """One line: where, overlap, margins, stop latency (kernel), takeover."""
        parts = [f"{self.where:<7}", f"overlap {self.overlap * 1000:6.0f} ms"]
        if self.margin is not None and self.deadline_margin is not None:
            parts.append(
                f"A's code ended {ahead(self.margin)} its key could expire, "
                f"{ahead(self.deadline_margin)} its local deadline"
            )
        if self.exited is not None and self.lost is not None:
            parts.append(f"child exited {(self.exited - self.lost) * 1000:5.1f} ms after the loss")
        parts.append(f"B took over {self.taken - self.blackholed:.2f}s after the black-hole")
        return ", ".join(parts)


def ahead(seconds: float) -> str:
    """Say ``seconds`` of margin as ``"12 ms before"`` or, negative, ``"40 ms after"``."""
    return f"{abs(seconds) * 1000:.0f} ms {'before' if seconds >= 0 else 'after'}"


@dataclass
class _Bed:
    """The two pods, their proxies and the trigger producer of one series of trials."""

    pods: list[PodProcess]
    proxies: dict[str, ChaosProxy]
    groups: list[str]
    topic: str
    producer: Any
    bootstrap: str
    marks: Path
    watch: ExitWatch
    sent: int = 0


async def takeover_trials(
    *,
    bootstrap: str,
    redis_port: int,
    workdir: Path,
    plan: Sequence[Where],
    out: Out = print,
) -> list[Trial]:
    """Run one trial per entry of ``plan`` on a fresh pair of pods; return them in order."""
    trials: list[Trial] = []
    async with _testbed(bootstrap, redis_port, workdir) as bed:
        for number, where in enumerate(plan):
            trial = await _trial(bed, number, where)
            out(f"trial {number + 1:>3}: {trial.line()}")
            trials.append(trial)
    return trials


@contextlib.asynccontextmanager
async def _testbed(bootstrap: str, redis_port: int, workdir: Path) -> AsyncIterator[_Bed]:
    token = secrets.token_hex(3)
    topic, namespace = f"takeover-{token}", f"takeover-{token}"
    await create_topics(bootstrap, [topic], partitions=1)
    marks = workdir / "marks"
    env = {
        TOPIC_VARIABLE: topic,
        MARKS_VARIABLE: str(marks),
        "LEASEWORKER_STORE_URL": f"sqlite:///{workdir / 'completions.sqlite3'}",
    }
    async with contextlib.AsyncExitStack() as stack:
        proxies: dict[str, ChaosProxy] = {}
        pods: list[PodProcess] = []
        groups: list[str] = []
        for name in ("pod-a", "pod-b"):
            proxy = proxies[name] = await stack.enter_async_context(ChaosProxy(redis_port))
            groups.append(group := f"{topic}-{name}")
            flags = [*("--bootstrap-servers", bootstrap, "--group", group), *POD_FLAGS]
            pods.append(
                pod_process(
                    name,
                    f"{__name__}:CpuReport",
                    workdir=workdir,
                    redis_url=f"redis://127.0.0.1:{proxy.port}/0",
                    flags=[*flags, "--namespace", namespace],
                    env=env,
                    proxy=proxy,
                )
            )
        for pod in pods:
            stack.push_async_callback(pod.stop, 10.0)
            pod.start()
        await until_ready(pods, within=90, partitions=True)
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        with anyio.fail_after(30):
            await producer.start()
        stack.push_async_callback(producer.stop)
        watch = stack.enter_context(ExitWatch())
        yield _Bed(pods, proxies, groups, topic, producer, bootstrap, marks, watch)


async def _trial(bed: _Bed, number: int, where: Where) -> Trial:
    key = f"cpu-{where}-{number}-{secrets.token_hex(2)}"
    payload = {"seconds": COMPUTE[where] * LEASE, "where": where}
    with anyio.fail_after(30):
        await bed.producer.send_and_wait(
            bed.topic, key=key.encode(), value=json.dumps(payload).encode()
        )
    bed.sent += 1
    first = await until_found(
        lambda: executions_of(bed.pods, key)[:1], within=60, what="the first start"
    )
    holder = next(p for p in bed.pods if p.name == first[0].pod)
    taker = next(p for p in bed.pods if p is not holder)
    file = bed.marks / f"{key}.{first[0].execution_id}"
    pid = await until_found(lambda: _computing(file, holder, where), within=30, what="A's marks")
    watched = where == "process" and bed.watch.add(pid)
    proxy = bed.proxies[holder.name]
    proxy.blackhole = True
    blackholed = time.monotonic()
    try:
        taken = await until_found(
            lambda: [e for e in executions_of(bed.pods, key) if e.pod == taker.name],
            within=COMPUTE[where] * LEASE + 30,
            what="the takeover",
        )
        ended = await until_found(
            lambda: [
                e
                for e in executions_of(bed.pods, key)
                if e.execution_id == first[0].execution_id and e.end is not None
            ],
            within=COMPUTE[where] * LEASE + 30,
            what="A's end",
        )
    finally:
        proxy.blackhole = False
        proxy.cut()
    exited = (
        await anyio.to_thread.run_sync(lambda: bed.watch.exited(pid, within=5)) if watched else None
    )
    found = read_marks(file)
    await until_committed(bed.bootstrap, bed.groups, bed.topic, bed.sent, within=90)
    lost = next((s.at for s in ended[0].steps if s.name == "lost"), None)
    return Trial(
        key=key,
        where=where,
        holder=holder.name,
        taker=taker.name,
        acquired=first[0].start,
        blackholed=blackholed,
        last_mark=max(max(at) for at in found.values()),
        exited=exited,
        lost=lost,
        expires=first_expiry(ended[0]),
        taken=taken[0].start,
    )


def _computing(marks: Path, holder: PodProcess, where: Where) -> int:
    """Return the pid computing ``marks`` once it marked for ``BLACKHOLE_AFTER`` s, else 0."""
    for pid, at in read_marks(marks).items():
        own = pid == holder.process.pid
        if own == (where == "loop") and at[-1] - at[0] >= BLACKHOLE_AFTER:
            return pid
    return 0
