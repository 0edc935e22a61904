"""``leaseworker demo``: three worker pods on a local stack, a Redis stall, and the proof.

Starts Redis and Kafka (and Jaeger when built) from the one stack builder,
three pods behind chaos proxies (ready when their ``/readyz`` says so) and the
example receiver of their notifications, sends reports, black-holes the Redis
of the pod running the slow one, and prints the summary, judged from the
pods' histories (``--record-history``) and the receiver's database; exits 1
on overlap, an incomplete trigger, a stall that did not play out, or a
notification not delivered exactly once (docs/workers.md#try-it-leaseworker-demo).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import anyio
from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]

from leaseworker.toolkit import (
    ChaosProxy,
    Execution,
    FaultWindow,
    History,
    render_html,
    render_text,
)

from .._services import (
    LocalJaeger,
    LocalKafka,
    LocalKafkaCluster,
    LocalPostgres,
    LocalPostgresPair,
    LocalRedis,
    LocalStack,
    PodProcess,
    Service,
    committed_total,
    histories,
    pod_process,
    shipped,
    until_ready,
)
from ._jaeger_links import key_history, lost_trace_url
from ._notifications import READY_TOPIC, Notifications, receiver_process, until_delivered

EXAMPLE = "examples/report_job"
"""Where ``demo_report.py`` lives (shipped in the wheel too); the pods' working directory."""
TOPIC = "reports.requested"  # MonthlyReport.topic
SERVICE = os.environ.get("OTEL_SERVICE_NAME") or "leaseworker"  # what the pods export as
DEFAULT_HTML = Path(tempfile.gettempdir()) / "leaseworker-demo-timeline.html"
"""Where the demo writes the stalled report's timeline page (overwritten by each run)."""
DEAD_LETTERS = "reports.dead-letter"
JOB = "demo_report:DemoMonthlyReport"
PARTITIONS = 3
SLOW_KEY = ("acme", "2026-10")
LEASE = 3.0  # DemoMonthlyReport.lease_duration
TENANTS = ("globex", "initech", "umbrella", "hooli")
PERIODS = ("2026-09", "2026-10", "2026-11")
POD_FLAGS = (
    *("--concurrency", "4", "--session-timeout", "6", "--heartbeat-interval", "1"),
    *("--revoke-timeout", "2", "--shutdown-timeout", "2", "--redis-timeout", "0.5"),
    *("--process-workers", "0"),  # DemoMonthlyReport never calls run_in_process
)
"""Short Kafka timings, so a hand-over takes seconds (the defaults suit production)."""

Out = Callable[[str], None]
Position = tuple[int, int]
"""A trigger's (partition, offset) on the demo topic."""


Standby = Literal["sync", "async"]
"""How a local PostgreSQL's primary treats its standby: commits wait for it, or not."""


@dataclass
class Stack:
    """The running local services and the demo's scratch directory (pod logs, histories)."""

    services: LocalStack
    workdir: Path

    @property
    def redis(self) -> LocalRedis:
        """The demo's Redis (each pod reaches it through a proxy of its own)."""
        return self.services.redis

    @property
    def kafka(self) -> LocalKafka:
        """The demo's Kafka broker."""
        return self.services.kafka

    @property
    def bootstrap_servers(self) -> str:
        """The three brokers' addresses when they run, else the one broker's."""
        cluster: LocalKafkaCluster | None = self.services.get("kafka3")
        return (cluster or self.services.kafka).bootstrap_servers

    @property
    def jaeger(self) -> LocalJaeger | None:
        """The local Jaeger, or ``None`` when its binary is not built."""
        found: LocalJaeger | None = self.services.get("jaeger")
        return found

    @property
    def postgres(self) -> LocalPostgres | LocalPostgresPair | None:
        """The local PostgreSQL (a primary and standby if asked), or ``None`` when not asked for."""
        found: LocalPostgres | LocalPostgresPair | None = self.services.get("postgres")
        return found


@contextlib.contextmanager
def local_stack(
    *, postgres: bool = False, standby: Standby | None = None, kafka3: bool = False
) -> Iterator[Stack]:
    """Start Redis, Kafka, Jaeger (when built) and PostgreSQL (if asked); stop all of them after.

    ``standby``: PostgreSQL is a primary and a streaming standby, ``sync`` or ``async``.
    ``kafka3``: three Kafka brokers instead of one.
    """
    workdir = Path(tempfile.mkdtemp(prefix="leaseworker-demo-"))
    postgres = postgres or standby is not None
    wanted: list[Service] = ["redis", "kafka3" if kafka3 else "kafka"]
    if postgres:
        wanted.append("postgres")
    starters: dict[Service, Callable[[], Any]] = {}
    if standby is not None:
        synchronous = standby == "sync"
        starters["postgres"] = functools.partial(LocalPostgresPair.start, synchronous=synchronous)
    with LocalStack(starters) as services:
        try:
            services.start(*wanted, optional=["jaeger"])
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)  # nothing ran: no pod logs to keep
            raise
        yield Stack(services, workdir)


@dataclass
class Summary:
    """What the run proved; ``ok`` decides the exit code."""

    triggers: int = 0
    duplicates: int = 0
    executions: list[Execution] = field(default_factory=list)  # what the pods recorded
    completed_triggers: int = 0
    answered_duplicates: int = 0  # triggers answered from the completion store, not run
    committed: int = 0
    overlapping: int = 0
    stall_pod: str = ""
    loss_after: float | None = None  # stall -> the slow report's body stopped
    takeover_after: float | None = None  # that stop -> started on another pod
    duration: float = 0.0
    lost_trace: str | None = None  # Jaeger URL of the execution whose lease was lost
    jaeger: str | None = None  # the local Jaeger's query URL
    slow_key: str = ""
    timeline: History | None = None  # the slow report's history, read from Jaeger
    stall: tuple[float, float] | None = None  # Unix times: black-holed, its pod stopped
    kept_running: bool = False  # the services stay up after the summary (--keep-running)
    timeline_html: Path | None = None
    notifications: Notifications | None = None  # committed against received

    def count(self, how: str) -> int:
        """Count the executions that ended ``how``."""
        return sum(1 for e in self.executions if e.outcome == how)

    @property
    def reruns(self) -> int:
        """Completed executions beyond one per run trigger: redeliveries after a hand-over."""
        return self.count("completed") - (self.completed_triggers - self.answered_duplicates)

    @property
    def ok(self) -> bool:
        """No overlap, all completed and committed, the stall taken over, notified once each."""
        return (
            self.overlapping == 0
            and self.completed_triggers == self.committed == self.triggers > 0
            and self.takeover_after is not None
            and self.notifications is not None
            and self.notifications.ok
        )

    def render(self) -> str:
        """Return the summary as aligned lines."""
        lost = self.loss_after
        takeover = self.takeover_after
        lines = [
            "== summary",
            f"  triggers sent        {self.triggers} ({self.duplicates} duplicates)",
            f"  completed            {self.completed_triggers}/{self.triggers} triggers, "
            f"{self.committed} offsets committed",
            f"  duplicates           {self.answered_duplicates} trigger(s) answered from the "
            "completion store without running",
            f"  executions           {self.count('completed')} completed, "
            f"{self.count('lost')} lost-and-stopped, {self.count('cancelled')} cancelled, "
            f"{self.count('failed')} failed",
            f"  re-runs              {self.reruns} trigger(s) ran again after the hand-over "
            "(redelivered before their completion was recorded)",
            f"  overlap              {self.overlapping} (pairs of executions of one report "
            "running at the same time)",
            f"  notifications        {(self.notifications or Notifications()).line()}",
            f"  stalled pod          {self.stall_pod or 'none'}: report stopped "
            + (f"{lost:.2f}s after the stall" if lost is not None else "NOT seen"),
            "  takeover             "
            + (
                f"{takeover:.2f}s from the stop to the start on another pod"
                if takeover is not None
                else "NOT seen"
            ),
            *(
                [
                    "  traces               the lost execution as JSON (the local Jaeger "
                    "has no web UI):",
                    "                       "
                    + self.lost_trace.replace("/trace/", "/api/v3/traces/"),
                ]
                if self.lost_trace
                else []
            ),
            f"  duration             {self.duration:.1f}s",
            f"  result               {'OK' if self.ok else 'FAILED'}",
        ]
        return "\n".join(lines) + self._timeline()

    def _timeline(self) -> str:
        """Draw the slow report's timeline from the traces, and say where its page is."""
        if self.timeline is None:
            return ""
        text = render_text(self.timeline, width=100)
        page = f"\nthe same as a page: {self.timeline_html}" if self.timeline_html else ""
        again = (
            f"\nagain, against the running Jaeger: leaseworker timeline {self.slow_key} "
            f"--jaeger {self.jaeger} --html timeline.html"
            if self.kept_running
            else ""
        )
        return f"\n\n== timeline of the stalled report (from the traces in Jaeger)\n{text}" + (
            page + again
        )


def stack_demo(
    out: Out = print, *, keep_running: bool = False, html: Path | None = DEFAULT_HTML
) -> Summary:
    """Run the whole demo; every service and pod it started is stopped before it returns.

    ``keep_running`` leaves Redis, Kafka and Jaeger up after the summary until
    Ctrl-C, so the printed trace URL can be opened and ``leaseworker timeline``
    run against it. With Jaeger, the stalled report's timeline page goes to ``html``.
    """
    began = time.monotonic()
    out("starting a private Redis, Kafka broker and (if built) Jaeger on loopback ports...")
    with local_stack() as stack:
        try:
            stack.kafka.create_topics([TOPIC, DEAD_LETTERS, READY_TOPIC], partitions=PARTITIONS)
            out(_services_line(stack))
            summary = anyio.run(_scenario, stack, out)
            if summary.timeline is not None and html is not None:
                title = f"leaseworker demo: the stalled report {summary.slow_key}"
                html.write_text(render_html(summary.timeline, title=title), encoding="utf-8")
                summary.timeline_html = html
            if keep_running:
                summary.kept_running = True
                summary.duration = time.monotonic() - began
                out(summary.render())
                _wait_for_interrupt(out)
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP: a requested stop
            shutil.rmtree(stack.workdir, ignore_errors=True)
            raise
        except BaseException:
            out(f"pod logs and histories kept in {stack.workdir}")
            raise
    if summary.ok:
        shutil.rmtree(stack.workdir, ignore_errors=True)
    else:
        out(f"pod logs and histories kept in {stack.workdir}")
    summary.duration = time.monotonic() - began
    return summary


def services_demo(
    out: Out = print,
    *,
    postgres: bool = False,
    standby: Standby | None = None,
    kafka_brokers: int = 1,
) -> None:
    """Start Redis, Kafka (one broker or three), (if built) Jaeger and PostgreSQL; keep them up.

    No pods: for running one's own job against a local stack (PostgreSQL as
    its store: the ``leaseworker`` database, its superuser's URL printed).
    ``standby``: PostgreSQL is a primary and a streaming standby, its URL
    names both (``target_session_attrs=read-write``).
    Ctrl-C (SIGTERM and SIGHUP too, see ``leaseworker demo``) stops every
    service and removes every directory the run made.
    """
    also = ", PostgreSQL" if postgres or standby else ""
    if standby is not None:
        also += f" with a{'n' if standby == 'async' else ''} {standby} standby"
    kafka = "three Kafka brokers" if kafka_brokers == 3 else "Kafka broker"
    out(f"starting a private Redis, {kafka}{also} and (if built) Jaeger on loopback ports...")
    with local_stack(postgres=postgres, standby=standby, kafka3=kafka_brokers == 3) as stack:
        try:
            out(_services_line(stack))
            bootstrap = stack.bootstrap_servers
            out(f"  topics: leaseworker topics create NAME --bootstrap-servers {bootstrap}")
            if stack.postgres is not None:
                out(f"  store: leaseworker run ... --store-url {stack.postgres.url}")
            _wait_for_interrupt(out)
        finally:
            shutil.rmtree(stack.workdir, ignore_errors=True)


def _services_line(stack: Stack) -> str:
    """Say where the services listen (the local Jaeger answers its query API, has no web UI)."""
    jaeger = f", Jaeger (query API) {stack.jaeger.query_url}" if stack.jaeger else ""
    postgres = f", PostgreSQL {stack.postgres.url}" if stack.postgres else ""
    return f"  Kafka {stack.bootstrap_servers}, Redis {stack.redis.url}{jaeger}{postgres}"


class _Clock:
    """Seconds since the demo's start, for the narration."""

    def __init__(self, out: Out) -> None:
        self._origin = time.monotonic()
        self._out = out

    def say(self, text: str) -> None:
        self._out(f"  t={time.monotonic() - self._origin:5.1f}s  {text}")


def telemetry_flags(stack: Stack) -> list[str]:
    """Return the pods' telemetry flags: traces to the demo's Jaeger (none without one)."""
    if stack.jaeger is None:
        return []
    return ["--otlp-endpoint", stack.jaeger.otlp_http_endpoint]


async def _scenario(stack: Stack, out: Out) -> Summary:
    group = f"demo-{secrets.token_hex(3)}"
    args = [
        *("--bootstrap-servers", stack.kafka.bootstrap_servers, "--group", group),
        *("--namespace", group, "--dead-letter-topic", DEAD_LETTERS),
        *POD_FLAGS,
        *telemetry_flags(stack),
    ]
    # One completion store shared by the pods (SQLite in WAL mode, one host).
    store_url = f"sqlite:///{stack.workdir / 'completions.sqlite3'}"
    env = {"LEASEWORKER_STORE_URL": store_url}
    clock = _Clock(out)
    summary = Summary()
    async with contextlib.AsyncExitStack() as exits:
        pods: list[PodProcess] = []
        exits.push_async_callback(_stop_all, pods)
        for name in ("pod-a", "pod-b", "pod-c"):
            proxy = await exits.enter_async_context(ChaosProxy(stack.redis.port))
            redis_url = f"redis://127.0.0.1:{proxy.port}/0"
            pod = pod_process(
                name, JOB, workdir=stack.workdir, redis_url=redis_url, flags=args, env=env
            )
            pod.cwd, pod.proxy = shipped(EXAMPLE), proxy
            pods.append(pod.start())
        bootstrap = stack.kafka.bootstrap_servers
        receiver = receiver_process(stack.workdir, shipped(EXAMPLE), bootstrap, group).start()
        exits.push_async_callback(_stop_all, [receiver])
        producer = AIOKafkaProducer(bootstrap_servers=stack.kafka.bootstrap_servers, acks="all")
        with anyio.fail_after(30):
            await producer.start()
        exits.push_async_callback(producer.stop)
        clock.say(f"3 pods started ({', '.join(p.name for p in pods)}); waiting for partitions")
        took = await until_ready(pods, within=45, partitions=True)
        held = "; ".join(f"{p.name} {p.assigned()}" for p in pods)
        clock.say(f"all pods ready (/readyz) {took:.1f}s after the start; partitions: {held}")
        run = _Run(stack, producer, pods, clock, summary, group)
        await _play(run)
        summary.notifications = await until_delivered(store_url, stack.workdir, within=30)
        run.clock.say(f"notifications: {summary.notifications.line()}")
        await _stop_all([*pods, receiver])
        clock.say("pods stopped")
        if stack.jaeger is not None:  # the pods flushed their spans on exit
            summary.jaeger = stack.jaeger.query_url
            summary.lost_trace = await anyio.to_thread.run_sync(lost_trace_url, stack.jaeger)
            history = await anyio.to_thread.run_sync(
                key_history, stack.jaeger, summary.slow_key, SERVICE
            )
            summary.timeline = _with_stall(history, summary)
    summary.executions = sorted(histories(pods).executions, key=lambda e: e.start)
    ran = _completed(summary.executions)
    summary.completed_triggers = len(ran | _answered(run, summary.executions))
    summary.answered_duplicates = len(_answered(run, summary.executions) - ran)
    summary.overlapping = len(History(executions=tuple(summary.executions)).overlapping())
    return summary


@dataclass
class _Run:
    """Everything one demo run works with."""

    stack: Stack
    producer: Any
    pods: list[PodProcess]
    clock: _Clock
    summary: Summary
    group: str
    sent: set[Position] = field(default_factory=set)
    keys: dict[Position, str] = field(default_factory=dict)

    def recorded(self) -> list[Execution]:
        """Return every execution the pods recorded so far, in start order."""
        return sorted(histories(self.pods).executions, key=lambda e: e.start)

    def executions(self, key: str) -> list[Execution]:
        """Return the executions of ``key`` so far, in start order."""
        return [e for e in self.recorded() if e.job_key == key]

    async def send(self, reports: Sequence[tuple[str, str, dict[str, Any]]]) -> None:
        """Produce one trigger per (tenant, period, extra fields), keyed by its job key."""
        for tenant, period, more in reports:
            key = f"report:{tenant}:{period}".encode()
            with anyio.fail_after(15):
                meta = await self.producer.send_and_wait(
                    TOPIC,
                    key=key,
                    value=json.dumps({"tenant": tenant, "period": period, **more}).encode(),
                )
            self.sent.add((meta.partition, meta.offset))
            self.keys[(meta.partition, meta.offset)] = key.decode()
        self.summary.triggers = len(self.sent)


async def _play(run: _Run) -> None:
    """Slow report, stream with duplicates, Redis stall on the slow report's pod, hand-over."""
    slow_key = f"report:{SLOW_KEY[0]}:{SLOW_KEY[1]}"
    run.summary.slow_key = slow_key
    release = run.stack.workdir / "stall-played-out"  # the slow report works until it exists
    await run.send([(*SLOW_KEY, {"rows": 20_000, "until_file": str(release)})])
    await _until(lambda: bool(run.executions(slow_key)), within=20, what="the slow report")
    first = run.executions(slow_key)[0]
    stalled = next(p for p in run.pods if p.name == first.pod)
    run.clock.say(f"slow report {slow_key} started on {stalled.name} (works until the stall)")
    stream = [(tenant, period, {"rows": 20_000}) for tenant in TENANTS for period in PERIODS]
    duplicates = stream[::3]
    await run.send(stream + duplicates)
    run.summary.duplicates = len(duplicates)
    run.clock.say(f"sent {len(stream)} reports and {len(duplicates)} duplicate triggers")
    await anyio.sleep(max(0.0, first.start + LEASE + 0.5 - time.monotonic()))
    run.clock.say(f"the slow report has outlived its {LEASE:.0f}s lease: renewals keep it")
    assert stalled.proxy is not None  # every demo pod has one
    stalled.proxy.blackhole = True
    stall_at = time.monotonic()
    stall_unix = time.time()
    run.summary.stall_pod = stalled.name
    run.clock.say(f"Redis stall injected for {stalled.name}: its renewals go unanswered")
    # The stall stops the execution holding now (a retry, if load lost a renewal before it).
    stopped = functools.partial(_stopped, run, slow_key, stalled.name, stall_at)
    await _until(lambda: bool(stopped()), within=LEASE + 5, what="the stalled report's stop")
    stop = stopped()[0]
    assert stop.end is not None
    release.touch()  # now the report may finish: the takeover's run need not wait
    run.summary.loss_after = stop.end - stall_at
    run.clock.say(
        f"{stalled.name} stopped the slow report ({stop.outcome}) "
        f"{run.summary.loss_after:.2f}s after the stall, before its lease could expire"
    )
    run.clock.say(f"orchestrator: {stalled.name} cannot reach Redis -> SIGTERM (drain 2s)")
    code = await stalled.stop(within=10)
    run.summary.stall = (stall_unix, time.time())
    run.clock.say(f"{stalled.name} exited with code {code}; the group rebalances")

    def taken_over() -> bool:
        return any(e.pod != stalled.name for e in run.executions(slow_key))

    await _until(taken_over, within=40, what="the takeover")
    new = next(e for e in run.executions(slow_key) if e.pod != stalled.name)
    run.summary.takeover_after = new.start - stop.end
    run.clock.say(
        f"{new.pod} took the slow report over {run.summary.takeover_after:.2f}s after the stop"
    )
    await _all_done(run)
    run.clock.say(f"all {run.summary.triggers} triggers completed and committed")


async def _all_done(run: _Run) -> None:
    """Wait until every sent trigger completed (the histories) and was committed (the broker)."""
    with anyio.fail_after(45):
        while True:
            executions = run.recorded()
            done = _completed(executions) | _answered(run, executions) >= run.sent
            total = await committed_total(run.stack.kafka.bootstrap_servers, run.group, TOPIC)
            run.summary.committed = total
            if done and total == len(run.sent):
                return
            await anyio.sleep(0.3)


def _with_stall(history: History | None, summary: Summary) -> History | None:
    """Add the Redis stall to the timeline, as the fault band over its pod."""
    if history is None or summary.stall is None:
        return history
    start, end = summary.stall
    stall = FaultWindow(kind="redis stall", start=start, end=end, target=summary.stall_pod)
    return replace(history, faults=(*history.faults, stall))


def _answered(run: _Run, executions: list[Execution]) -> set[Position]:
    """Triggers whose identical request completed: the store answers them ``duplicate``.

    In this demo every report's inputs are fixed per job key, so a trigger's
    identity is its key; a trigger that did not run itself is done once an
    execution of its key completed (and its offset is committed, checked apart).
    """
    done_keys = {e.job_key for e in executions if e.outcome == "completed"}
    return {position for position, key in run.keys.items() if key in done_keys}


def _stopped(run: _Run, key: str, pod: str, since: float) -> list[Execution]:
    return [e for e in run.executions(key) if e.pod == pod and (e.end or 0) >= since]


def _completed(executions: list[Execution]) -> set[Position]:
    """Triggers (by position) that at least one execution completed."""
    return {
        (e.partition, e.offset)
        for e in executions
        if e.outcome == "completed" and e.partition is not None and e.offset is not None
    }


async def _until(check: Callable[[], bool], *, within: float, what: str) -> None:
    """Poll state of other processes (history files) until ``check()`` or time is up."""
    with anyio.move_on_after(within) as waiting:
        while not check():  # noqa: ASYNC110 - other processes cannot set our Events
            await anyio.sleep(0.1)
    if waiting.cancelled_caught:
        raise TimeoutError(f"the demo waited {within:.0f}s for {what}")


async def _stop_all(pods: list[PodProcess]) -> None:
    """SIGTERM every pod still running (in parallel), SIGKILL what outlives the drain."""
    async with anyio.create_task_group() as tg:
        for pod in pods:
            if pod.running():
                tg.start_soon(pod.stop, 10.0)


def _wait_for_interrupt(out: Out) -> None:
    """Wait for Ctrl-C (the demo command makes SIGTERM and SIGHUP act as one too)."""
    try:  # the line too: a test signals as soon as it reads it
        out("services are kept running for inspection; press Ctrl-C to stop them")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        out("stopping the services")
