"""One campaign, start to verdict: services, pods, triggers and faults, drain, stop, check.

:func:`run_campaign` starts the local stack, runs the pods of the user's job,
sends the planned triggers while the planned faults play, heals, waits for
every trigger to be committed (bounded), stops the pods with SIGTERM, reads
the witnesses and the pods' histories, and checks them. Every service and
process it started is stopped by PID; its scratch directory is removed unless
the campaign failed (then it holds the pod logs and histories). SIGINT,
SIGTERM or SIGHUP stop a campaign the same way, without a verdict
(:class:`Interrupted`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]

from leaseworker.toolkit import (
    ChaosProxy,
    History,
    KafkaSecurity,
    MalformedTrigger,
    ReportJob,
    create_topics,
    decode_trigger,
    resolve_job_key,
)

from .._services import PodProcess, until_ready
from ._campaign_records import PodExit, Produced, Records
from ._checker import check
from ._exercise import Exercise, exercise
from ._fault_play import Injector
from ._invariant_verdict import Verdict
from ._outbox_audit import install_audit, outbox_rows, reclaims, topics_of
from ._outside_checker import NAME as OUTSIDE
from ._outside_checker import available as outside_available
from ._outside_checker import outside_verdict
from ._payloads import Generator
from ._plan import Plan, fault_kinds, make_plan
from ._promotion import loss_note
from ._receiver import Receiver
from ._testbed import (
    POD_FLAGS,
    Services,
    Standby,
    Topology,
    make_pod,
    marks_dir,
    refused,
    services,
    store_proxy,
)
from ._witness import committed, completions, dead_letters, marks, pods_history

Out = Callable[[str], None]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Signals that stop a campaign: its faults and triggers end, its pods and services stop."""


class Interrupted(Exception):
    """The campaign was stopped by a signal; everything it started is stopped."""

    def __init__(self, signum: int) -> None:
        self.signal = signal.Signals(signum).name
        super().__init__(f"stopped by {self.signal}; no verdict")


PARTITIONS = 6
"""Partitions of the job's topic in the campaign: enough to spread over the pods."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """What one campaign runs: the job, the seed, the fault count and the deployment."""

    job: str
    job_class: type[ReportJob]
    payloads: Generator
    payloads_spec: str | None = None
    faults: int = 20
    seed: int = 1
    pods: int = 3
    concurrency: int = 4
    keys: int = 8
    store_url: str | None = None
    topology: Topology = "single"
    bootstrap_servers: str | None = None  # an external broker: no broker faults
    kafka_security: KafkaSecurity = field(default_factory=KafkaSecurity)
    kafka_brokers: int = 1  # 3: our own three-broker cluster, whose brokers die
    hosts: bool = False  # pods and services on network namespaces, cut apart
    postgres_standby: Standby | None = None  # the store on our primary and standby

    def replay(self) -> str:
        """Return the command that replays this campaign's plan."""
        parts = [
            f"leaseworker chaos {self.job} --seed {self.seed} --faults {self.faults}",
            f"--pods {self.pods} --concurrency {self.concurrency} --keys {self.keys}",
            f"--topology {self.topology}",
        ]
        if self.kafka_brokers != 1:
            parts.append(f"--kafka-brokers {self.kafka_brokers}")
        if self.hosts:
            parts.append("--hosts")
        if self.postgres_standby:
            parts.append(f"--postgres-standby {self.postgres_standby}")
        if self.payloads_spec:
            parts.append(f"--payloads {self.payloads_spec}")
        if self.store_url:
            parts.append("--store-url '<the same store URL>'")
        if self.bootstrap_servers:
            parts.append("--bootstrap-servers '<the same brokers and credentials>'")
        return " ".join(parts)


@dataclass
class Result:
    """What the campaign did and what the checker said."""

    settings: Settings
    plan: Plan
    history: History
    records: Records
    verdicts: list[Verdict]
    skipped: int
    store: str
    wall: float
    exercised: Exercise | None = None
    workdir: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def inconclusive(self) -> str | None:
        """Why the campaign proves nothing (it barely exercised the job), or ``None``."""
        return None if self.exercised is None else self.exercised.inconclusive

    @property
    def ok(self) -> bool:
        """Whether every invariant held, over a campaign that exercised the job."""
        return all(v.passed for v in self.verdicts) and self.inconclusive is None


def run_campaign(settings: Settings, out: Out = print) -> Result:
    """Run the campaign of ``settings`` and check it; stops everything it started."""
    began = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="leaseworker-chaos-"))
    keep = True
    try:
        on = ", each on a host of its own" if settings.hosts else ""
        out(f"starting Kafka, Redis ({settings.topology}) and the completion store{on}...")
        with services(
            settings.topology,
            settings.store_url,
            workdir,
            bootstrap_servers=settings.bootstrap_servers,
            kafka_security=settings.kafka_security,
            kafka_brokers=settings.kafka_brokers,
            hosts=settings.hosts,
            postgres_standby=settings.postgres_standby,
        ) as stack:
            try:
                result = anyio.run(_campaign, settings, stack, out)
            except Interrupted:
                keep = False  # asked to stop: nothing to look at, nothing left behind
                raise
            except BaseException as exc:
                if refused(exc):
                    keep = False  # the brokers refused the credentials: no pod ran
                    raise
                out(f"the campaign broke off; pod logs and histories kept in {workdir}")
                raise
        result.wall = time.monotonic() - began
        keep = not result.ok
        result.workdir = workdir if keep else None
        return result
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


async def _campaign(settings: Settings, stack: Services, out: Out) -> Result:
    """Run :func:`_campaign_body` until it ends or a stop signal comes (then :class:`Interrupted`).

    A signal does not cancel the campaign (a cancelled clean-up could not stop
    the pods): it ends the faults and triggers and skips the drain; the pods
    and services then stop as after any campaign.
    """
    stopped: list[int] = []
    stop = anyio.Event()
    with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                async for signum in signals:
                    if not stopped:
                        out(f"{signal.Signals(signum).name}: stopping the campaign")
                        stopped.append(signum)
                        stop.set()

            tg.start_soon(watch)
            result = await _campaign_body(settings, stack, out, stop)
            tg.cancel_scope.cancel()
    if result is None:
        raise Interrupted(stopped[0])
    return result


async def _campaign_body(
    settings: Settings, stack: Services, out: Out, stop: anyio.Event
) -> Result | None:
    """Run the campaign itself; return ``None`` once ``stop`` cut it short (its pods stopped)."""
    job = settings.job_class()
    lease = float(settings.job_class.lease_duration)
    topic, group = job.topic, f"chaos-{settings.seed}-{secrets.token_hex(3)}"
    dead_topic = f"{topic}.chaos-dead-letters"
    bootstrap, security = stack.bootstrap_servers, stack.kafka_security
    await create_topics(
        bootstrap,
        [topic, dead_topic],
        partitions=PARTITIONS,
        exist_ok=stack.external_kafka is not None,
        security=security,
    )
    names = [f"pod-{i + 1}" for i in range(settings.pods)]
    own_store = settings.store_url is None
    if own_store:
        await install_audit(stack.store_url)
    async with store_proxy(stack) as pod_store_url, contextlib.AsyncExitStack() as exits:
        kinds = fault_kinds(
            settings.topology,
            store_outages=stack.store_proxy is not None,
            own_store=own_store,
            own_kafka=stack.external_kafka is None,
            kafka_brokers=settings.kafka_brokers,
            hosts=stack.hosts is not None,
            postgres_standby=stack.postgres_pair is not None,
        )
        plan = make_plan(
            seed=settings.seed,
            faults=settings.faults,
            kinds=kinds,
            pods=names,
            keys=settings.keys,
            lease=lease,
        )
        flags = [
            *("--bootstrap-servers", bootstrap, "--group", group),
            *("--namespace", group, "--dead-letter-topic", dead_topic),
            *("--concurrency", str(settings.concurrency), *POD_FLAGS),
        ]
        pods: dict[str, PodProcess] = {}
        for name in names:
            proxy = None
            if stack.redis is not None and stack.hosts is not None:
                redis_url = stack.redis.url  # directly: the partitions cut it on the network
            elif stack.redis is not None:
                proxy = await exits.enter_async_context(ChaosProxy(stack.redis_port))
                redis_url = f"redis://127.0.0.1:{proxy.port}/0"
            else:
                redis_url = stack.shared_redis_url
            pods[name] = make_pod(
                name,
                job=settings.job,
                redis_url=redis_url,
                store_url=pod_store_url,
                flags=flags,
                workdir=stack.workdir,
                proxy=proxy,
                kafka_env=stack.pod_env(),
                place=stack.pod_place(name),
            )
        exits.push_async_callback(_stop_all, list(pods.values()), 1.0)
        for pod in pods.values():
            pod.start()
        # Ready by /readyz; each holding a partition when there are enough to go round.
        spread = settings.pods <= PARTITIONS
        await until_ready(list(pods.values()), within=90, partitions=spread)
        out(f"{len(pods)} pods of {settings.job} running; playing {len(plan.faults)} faults")
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", **stack.kafka_kwargs())
        with anyio.fail_after(30):
            await producer.start()
        exits.push_async_callback(producer.stop)
        effects_of = None if stack.external_kafka is None else topics_of(stack.store_url, group)
        name, excluded = f"{group}-receiver", [topic, dead_topic]
        receiver = Receiver(bootstrap, name, excluded, stack.workdir, security, effects_of)
        receiving = await exits.enter_async_context(anyio.create_task_group())
        exits.callback(receiving.cancel_scope.cancel)  # unwinds first: the receiver stops
        receiving.start_soon(receiver.run)
        injector = Injector(stack, pods, lease, receiver=receiver)
        wall_offset = time.time() - time.monotonic()
        produced = await _play(settings, plan, job, producer, injector, pods, out, stop)
        drained = False
        if not stop.is_set():
            out(f"faults healed; draining {len(produced)} triggers and their effects")
            drained = await _drain(stack, group, topic, produced, lease, stop)
            drained = await _drain_effects(stack.store_url, group, receiver, stop) and drained
        for pod in pods.values():
            await pod.stop(within=15.0)
        if stop.is_set():
            return None
        await _caught_up(receiver, within=15.0)  # the last records sent before the pods stopped
        records = await _records(stack, settings, group, topic, dead_topic, produced, pods)
        records = dataclasses.replace(
            records,
            outbox=await outbox_rows(stack.store_url, group),
            deliveries=tuple(receiver.deliveries),
            processed=receiver.processed(),
            reclaims=await reclaims(stack.store_url, group, audited=own_store),
            wall_offset=wall_offset,
            marks=marks(marks_dir(stack.workdir)),
            receiver_errors=tuple(receiver.consumer_errors),
        )
    history = pods_history(pods, injector.faults, stack.workdir)
    ops = stack.workdir / "store-ops.jsonl"
    verdicts, unjudged = await anyio.to_thread.run_sync(_judged, history, records, ops)
    result = Result(
        settings=settings,
        plan=plan,
        history=history,
        records=records,
        verdicts=verdicts,
        skipped=len(injector.skipped),
        store=_store_name(stack),
        wall=0.0,
        exercised=exercise(history, records, keys=settings.keys, payloads=settings.payloads_spec),
    )
    if not drained:
        result.notes.append("the drain timed out: some triggers or effects never got through")
    result.notes.extend(unjudged)
    return result


def _judged(history: History, records: Records, ops: Path) -> tuple[list[Verdict], list[str]]:
    """Our checker's verdicts and Porcupine's, and notes: Porcupine not built, a promotion's loss.

    Porcupine's NOT linearizable, or its error, fails the campaign like any invariant;
    its input is left in ``ops`` (kept with the scratch directory of a failed run).
    """
    verdicts = check(history, records)
    notes: list[str] = []
    if not outside_available():
        notes.append(f"{OUTSIDE} not run: no Go toolchain to build it")
    else:
        try:
            verdicts.append(outside_verdict(history, records, keep=ops))
        except (RuntimeError, OSError, subprocess.SubprocessError, ValueError) as exc:
            failed = (f"could not judge: {exc}",)
            verdicts.append(Verdict(name=OUTSIDE, passed=False, violations=failed))
    lost = loss_note(history, verdicts)  # after Porcupine's: the keys it refused are named
    return verdicts, notes if lost is None else [*notes, lost]


async def _play(
    settings: Settings,
    plan: Plan,
    job: ReportJob,
    producer: Any,
    injector: Injector,
    pods: dict[str, PodProcess],
    out: Out,
    stop: anyio.Event,
) -> list[Produced]:
    """Send the planned triggers while the planned faults play; restart pods that crash.

    ``stop`` ends both early (a fault in play is left as it is: stopping the
    pods and services undoes it).
    """
    origin = time.monotonic()
    produced: list[Produced] = []
    rng = random.Random(f"{settings.seed}:payloads")

    async def send_all() -> None:
        for planned in plan.triggers:
            await anyio.sleep_until(_loop_time(origin + planned.at))
            key, payload = settings.payloads(rng, planned.key, planned.version)
            produced.append(await _send(producer, job, key, payload))

    async def play_all() -> None:
        async with anyio.create_task_group() as faults:
            for planned in plan.faults:
                await anyio.sleep_until(_loop_time(origin + planned.at))
                faults.start_soon(injector.play, planned)

    async with anyio.create_task_group() as tg:
        tg.start_soon(_watch, pods, out)
        tg.start_soon(_cancel_on, stop, tg.cancel_scope)
        async with anyio.create_task_group() as playing:
            playing.start_soon(send_all)
            playing.start_soon(play_all)
        tg.cancel_scope.cancel()
    return produced


def _loop_time(monotonic: float) -> float:
    """Turn a ``time.monotonic()`` moment into the event loop's clock (the same on asyncio)."""
    return anyio.current_time() + (monotonic - time.monotonic())


async def _send(
    producer: Any, job: ReportJob, key: str | None, payload: dict[str, Any]
) -> Produced:
    """Produce one trigger, retrying while the broker is away; return where it landed."""
    value = json.dumps(payload).encode()
    raw_key = None if key is None else key.encode()
    with anyio.fail_after(180):
        while True:
            try:
                with anyio.fail_after(20):
                    meta = await producer.send_and_wait(job.topic, key=raw_key, value=value)
                break
            except Exception:  # the broker restarting: try again
                await anyio.sleep(0.5)
    trigger = decode_trigger(
        topic=job.topic, partition=meta.partition, offset=meta.offset, key=raw_key, value=value
    )
    try:
        job_key, version = resolve_job_key(job.job_key, trigger), job.input_version(trigger)
    except MalformedTrigger:
        job_key, version = "", ""  # the pods dead-letter it
    return Produced(
        partition=meta.partition, offset=meta.offset, job_key=job_key, input_version=version
    )


async def _cancel_on(stop: anyio.Event, scope: anyio.CancelScope) -> None:
    await stop.wait()
    scope.cancel()


async def _watch(pods: dict[str, PodProcess], out: Out) -> None:
    """Restart a pod that exited on its own (the exit is recorded: a crash)."""
    while True:
        for pod in pods.values():
            code = pod.exited()
            if code is not None:
                out(f"  {pod.name} exited by itself with {code}: restarted ({pod.last_words()})")
                pod.start()
        await anyio.sleep(0.5)


_DRAIN_LIMIT = 3600.0
"""Seconds a drain may take in all, however steadily the backlog shrinks."""


async def _drain(
    stack: Services,
    group: str,
    topic: str,
    produced: Sequence[Produced],
    lease: float,
    stop: anyio.Event,
) -> bool:
    """Wait until every produced offset is committed; return whether it was.

    A backlog left by the faults drains at its own pace, so the wait ends only
    when the committed offsets stop moving for ``max(90, 3 * lease + 60)``
    seconds (a stall: the checker reports what is left) or after an hour.
    """
    needed: dict[int, int] = {}
    for trigger in produced:
        needed[trigger.partition] = max(needed.get(trigger.partition, 0), trigger.offset + 1)
    patience = max(90.0, 3 * lease + 60)
    with anyio.move_on_after(_DRAIN_LIMIT):
        seen, still_since = -1, anyio.current_time()
        while anyio.current_time() - still_since < patience and not stop.is_set():
            with contextlib.suppress(Exception):
                positions = await committed(
                    stack.bootstrap_servers, group, topic, stack.kafka_security
                )
                if all(positions.get(p, 0) >= n for p, n in needed.items()):
                    return True
                progress = sum(positions.values())
                if progress > seen:
                    seen, still_since = progress, anyio.current_time()
            await anyio.sleep(1.0)
    return False


async def _drain_effects(
    store_url: str, namespace: str, receiver: Receiver, stop: anyio.Event
) -> bool:
    """Wait until every committed message is marked sent and the receiver has read it all.

    Gives up after 90 s without progress (the checker reports what is left).
    """
    seen, still_since = None, anyio.current_time()
    while anyio.current_time() - still_since < 90 and not stop.is_set():
        with contextlib.suppress(Exception):
            rows = await outbox_rows(store_url, namespace)
            left = sum(1 for row in rows if row.sent is None)
            topics = {row.topic for row in rows}
            behind = await receiver.behind() if topics else 0
            if left == 0 and behind == 0 and topics <= receiver.topics():
                return True
            progress = (left, len(receiver.deliveries))
            if progress != seen:
                seen, still_since = progress, anyio.current_time()
        await anyio.sleep(1.0)
    return False


async def _caught_up(receiver: Receiver, within: float) -> None:
    """Give the receiver ``within`` seconds to read what is on its topics already."""
    with anyio.move_on_after(within):
        while (await receiver.behind()) not in (0, None):  # noqa: ASYNC110 - a broker's state
            await anyio.sleep(0.2)


async def _records(
    stack: Services,
    settings: Settings,
    group: str,
    topic: str,
    dead_topic: str,
    produced: list[Produced],
    pods: dict[str, PodProcess],
) -> Records:
    bootstrap, security = stack.bootstrap_servers, stack.kafka_security
    identities = {(p.job_key, p.input_version) for p in produced}
    return Records(
        produced=tuple(produced),
        committed=await committed(bootstrap, group, topic, security),
        dead_letters=await dead_letters(bootstrap, dead_topic, security),
        completions=await completions(stack.store_url, group, identities),
        exits=tuple(
            PodExit(pod=pod.name, code=code, killed=killed)
            for pod in pods.values()
            for code, killed, _ in pod.exits
        ),
    )


def _store_name(stack: Services) -> str:
    if stack.postgres is not None and stack.hosts is not None:
        return "PostgreSQL (local, on a host of its own)"
    if stack.postgres_pair is not None:
        mode = "synchronous" if stack.postgres_pair.synchronous else "asynchronous"
        return f"PostgreSQL (local primary and {mode} standby, a multi-host URL)"
    if stack.postgres is not None:
        return "PostgreSQL (local, behind a fault proxy)"
    return stack.store_url.split("://", 1)[0]


async def _stop_all(pods: list[PodProcess], within: float) -> None:
    """SIGTERM every pod still running (after an error); SIGKILL what outlives ``within``."""
    async with anyio.create_task_group() as tg:
        for pod in pods:
            if pod.running():
                tg.start_soon(pod.stop, within)
