"""Pod throughput with telemetry on (spans to a real Jaeger, Prometheus metrics) vs off.

One in-process worker pod runs a trivial job for ``--triggers`` triggers on a
fresh one-partition topic per round, against a private Kafka broker, Redis and
Jaeger started here. "off" is ``Pod(..., telemetry=None)``; "on" is what
``leaseworker run --otlp-endpoint ... --metrics-port ...`` sets up (OTLP/HTTP
batch export to Jaeger, a Prometheus reader). Rounds alternate off/on so
machine noise hits both alike; throughput is counted from the first job start
to the last job end (group joins excluded). The figure that matters is the
ratio; the target is on/off >= 0.90.

    .venv/bin/python bench/telemetry_overhead.py [--triggers 400] [--rounds 3]
        [--job-seconds 0[,0.01,...]] [--sample-ratio R] [--store-url memory://]
        [--no-gc-tuning] [--count-calls] [--breakdown]

``--job-seconds 0`` measures the worker's own cost per trigger (worst case for
telemetry: seven spans per trigger against a no-op job); jobs with some I/O
(``--job-seconds 0.01,0.05``) show what the overhead means for real work. A
comma-separated list measures each job time in the same run, one line each.
``--sample-ratio R`` traces that fraction of triggers
(``OTEL_TRACES_SAMPLER=parentbased_traceidratio``, ``_ARG=R``; default: every
trigger, the SDK's default sampler).
Like ``leaseworker run``, the process tunes its garbage collector before the
rounds (start-up heap frozen, rarer young collections; ``--no-gc-tuning``:
leave the collector as it is); each side's time in the collector is reported
per 1,000 triggers. The ratio is given
twice: of the sides' medians, and the median of each round's own on/off
ratio (an off round and the on round after it share the machine's mood).
``--count-calls`` measures the same thing without a clock: one round per
side with a profiler hook counting the Python function calls made while the
worker runs (the export thread's included), per trigger, and how many of them
are telemetry's own (in ``leaseworker._telemetry`` or ``opentelemetry``). The
machine's mood does not change those counts; the pod's batching does a
little (a few percent between runs).
``--breakdown`` says where the time goes: each round also runs a second
"off" side (a control: the spread of its ratio is the machine's noise), a
side with metrics but no tracer ("+metrics": every hook, no span), and a side
whose spans are made but go nowhere ("+spans": the sampler and the spans, no
export). Every side reports the CPU it cost per trigger (Linux ``/proc``):
the pod's event-loop thread, its other threads (the export thread) and each
service (Kafka, Redis, Jaeger), which on a small machine share the pod's cores.
The completion store defaults to ``memory://`` (in-process, no database) so
that the figure is telemetry against the worker's own cost; with the default durable file store
(``--store-url sqlite:////tmp/x.sqlite3``) its fsyncs dominate both sides
and hide most of telemetry's cost.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import anyio
from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]

from leaseworker import JobContext, Pod, PodConfig, ReportJob
from leaseworker._cli._run_command import tune_garbage_collector
from leaseworker._telemetry import Telemetry
from leaseworker._telemetry._lean import LeanTracerProvider
from leaseworker._telemetry._setup import ConfiguredTelemetry, _span_exporter, configure
from leaseworker_dev._services import LocalRedis
from leaseworker_dev._services._kafka import LocalKafka
from leaseworker_dev._services._local_jaeger import LocalJaeger
from leaseworker_dev._services._local_stack import LocalStack


class Counted(ReportJob):
    """A job that waits ``seconds`` (simulated I/O; 0: the worker's own cost only) and counts."""

    topic = "unset"
    lease_duration = 10.0

    def __init__(self, expected: int, seconds: float) -> None:
        self.expected = expected
        self.seconds = seconds
        self.first: float | None = None
        self.last = 0.0
        self.count = 0
        self.done = anyio.Event()

    async def run(self, ctx: JobContext) -> object:
        """Count the run; set ``done`` at the last one."""
        now = time.perf_counter()
        self.first = self.first or now
        await anyio.sleep(self.seconds)  # the job's own I/O, if any
        await ctx.checkpoint()
        self.count += 1
        self.last = time.perf_counter()
        if self.count == self.expected:
            self.done.set()
        return None


class CollectorClock:
    """Seconds spent in the garbage collector (all generations), from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.total = 0.0
        self._began = 0.0
        gc.callbacks.append(self._on_phase)

    def _on_phase(self, phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.total += time.perf_counter() - self._began


class CpuClock:
    """CPU seconds used so far by this process (its main thread apart) and by the services.

    Read from Linux ``/proc``: this process in all (exited threads included),
    its main thread (the event loop), and each service process by pid. Other
    threads are the process minus the main thread: the span export thread,
    mostly.
    """

    TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def __init__(self, services: Mapping[str, int]) -> None:
        self.services = dict(services)

    def read(self) -> dict[str, float]:
        """Return the CPU seconds of ``pod main``, ``pod other`` and each service, so far."""
        pod = self._seconds(Path("/proc/self/stat"))
        main = self._seconds(Path(f"/proc/self/task/{os.getpid()}/stat"))
        seconds = {"pod main": main, "pod other": pod - main}
        for name, pid in self.services.items():
            seconds[name] = self._seconds(Path(f"/proc/{pid}/stat"))
        return seconds

    @classmethod
    def _seconds(cls, stat: Path) -> float:
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # not Linux, or the process is gone
            return 0.0
        return (int(fields[11]) + int(fields[12])) / cls.TICKS  # utime + stime


class CallCounter:
    """Counts Python function calls in every thread while switched on (``--count-calls``).

    Installed before telemetry starts its export thread, so that thread is
    counted too. The hook slows every call even while it is off, so a
    counting run is never a timing run.
    """

    TELEMETRY = ("/leaseworker/_telemetry/", "/opentelemetry/")

    def __init__(self) -> None:
        self.on = False
        self.calls = 0
        self.telemetry = 0
        threading.setprofile(self._hook)
        sys.setprofile(self._hook)

    def _hook(self, frame: FrameType, event: str, _arg: object) -> None:
        if event == "call" and self.on:
            self.calls += 1
            if any(part in frame.f_code.co_filename for part in self.TELEMETRY):
                self.telemetry += 1

    @contextmanager
    def counting(self) -> Iterator[None]:
        """Count from zero while the block runs."""
        self.calls = self.telemetry = 0
        self.on = True
        try:
            yield
        finally:
            self.on = False


async def produce(bootstrap: str, topic: str, count: int) -> None:
    """Put ``count`` triggers with distinct keys on ``topic``."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    with anyio.fail_after(60):
        await producer.start()
        try:
            sent = [
                await producer.send(topic, value=b"{}", key=f"k{i}".encode()) for i in range(count)
            ]
            for future in sent:
                await future
        finally:
            await producer.stop()


async def one_round(
    kafka: LocalKafka,
    redis: LocalRedis,
    triggers: int,
    telemetry: Telemetry | None,
    seconds: float,
    store_url: str,
) -> float:
    """Run ``triggers`` triggers through a fresh worker; return executions per second."""
    topic = await fresh_topic(kafka, triggers)
    return await run_worker(kafka, redis, topic, triggers, telemetry, seconds, store_url)


async def fresh_topic(kafka: LocalKafka, triggers: int) -> str:
    """Create a topic and put ``triggers`` triggers on it; return its name."""
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    kafka.create_topics([topic])
    await produce(kafka.bootstrap_servers, topic, triggers)
    return topic


async def run_worker(
    kafka: LocalKafka,
    redis: LocalRedis,
    topic: str,
    triggers: int,
    telemetry: Telemetry | None,
    seconds: float,
    store_url: str,
) -> float:
    """Run a fresh worker (group of its own) until ``topic``'s triggers ran; return their rate."""
    job_class = type("Counted", (Counted,), {"topic": topic})
    job: Counted = job_class(triggers, seconds)
    config = PodConfig(
        bootstrap_servers=kafka.bootstrap_servers,
        redis_url=redis.url,
        group=f"group-{topic}",
        pod="bench-pod",
        namespace=f"ns-{topic}",
        concurrency=16,
        poll_timeout=0.05,
        store_url=store_url,
    )
    worker = Pod(job, config, telemetry=telemetry)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(300):
            await job.done.wait()
        worker.stop()
    assert job.first is not None
    return (triggers - 1) / (job.last - job.first)


@dataclass(frozen=True)
class Round:
    """One side's round: its rate, its time in the collector, the CPU it cost per trigger."""

    rate: float
    gc_seconds: float
    cpu: dict[str, float]
    """CPU seconds per trigger: ``pod main``, ``pod other``, ``kafka``, ``redis``, ``jaeger``."""
    dropped: int = 0
    """Spans the pod's batch processor dropped (queue full) in the round."""


Samples = dict[float, dict[str, list[Round]]]
"""Per job time, per side (``off`` first): one :class:`Round` per round."""


ON_SLOW_SWITCH = "on, 5 ms switch"
"""The ``on`` side with CPython's default GIL switch interval (see ``_setup.SWITCH_INTERVAL``)."""

ON_SDK_BATCH = "on, SDK batch"
"""The ``on`` side with the SDK's ``BatchSpanProcessor`` (its defaults) instead of ``_batch``'s."""


@dataclass(frozen=True)
class Stack:
    """The services of a run and telemetry as ``leaseworker run`` configures it."""

    kafka: LocalKafka
    redis: LocalRedis
    jaeger: LocalJaeger
    configured: ConfiguredTelemetry
    sdk_batch: tuple[Telemetry, LeanTracerProvider] | None = None
    """The pod's telemetry exporting through the SDK's batch processor, and its provider."""

    def pids(self) -> dict[str, int]:
        """Each service's process id, by name."""
        return {
            "kafka": self.kafka.process.pid,
            "redis": self.redis.process.pid,
            "jaeger": self.jaeger.process.pid,
        }

    def sides(self, breakdown: bool) -> dict[str, Telemetry | None]:
        """Return the telemetry of each side, ``off`` first and ``on`` last (``--breakdown``)."""
        configured = self.configured
        if not breakdown:
            sides = {"off": None, "on": configured.telemetry, ON_SLOW_SWITCH: configured.telemetry}
            if self.sdk_batch is not None:
                sides[ON_SDK_BATCH] = self.sdk_batch[0]
            return sides
        traced = configured.tracer_provider
        unexported = LeanTracerProvider(  # the pod's sampler and ids, no span processor
            traced.resource, traced.sampler, id_generator=traced.id_generator
        )
        return {
            "off": None,
            "off (control)": None,
            "+metrics": Telemetry(meter_provider=configured.meter_provider),
            "+spans": Telemetry(
                tracer_provider=unexported, meter_provider=configured.meter_provider
            ),
            "on": configured.telemetry,
        }


def sdk_batch_telemetry(
    configured: ConfiguredTelemetry, endpoint: str
) -> tuple[Telemetry, LeanTracerProvider]:
    """Return the pod's telemetry as configured, but with the SDK's ``BatchSpanProcessor``."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    traced = configured.tracer_provider
    provider = LeanTracerProvider(traced.resource, traced.sampler, id_generator=traced.id_generator)
    provider.add_span_processor(
        BatchSpanProcessor(_span_exporter(f"{endpoint}/v1/traces", "http/json"))
    )
    return Telemetry(tracer_provider=provider, meter_provider=configured.meter_provider), provider


def lowest_priority(pid: int) -> None:
    """Give process ``pid`` the lowest CPU priority (nice 19; Linux).

    Jaeger stands for a collector on other machines: at nice 19 it takes
    little CPU from the pod, Kafka and Redis while they want it. It runs in
    a session of its own, so with autogroup scheduling its group's niceness
    is what counts against the others; niceness is per thread on Linux
    (threads made later inherit it).
    """
    with contextlib.suppress(OSError):  # no autogroup scheduling
        Path(f"/proc/{pid}/autogroup").write_text("19")
    tasks = Path(f"/proc/{pid}/task")
    for task in tasks.iterdir() if tasks.is_dir() else ():
        with contextlib.suppress(OSError):  # a thread that just ended
            os.setpriority(os.PRIO_PROCESS, int(task.name), 19)


@asynccontextmanager
async def stack(sdk_batch: bool = False, own_cpu_for_jaeger: bool = False) -> AsyncIterator[Stack]:
    """Start Kafka, Redis and Jaeger, and telemetry as ``leaseworker run`` configures it.

    Jaeger runs at the lowest CPU priority unless ``own_cpu_for_jaeger``
    (see :func:`lowest_priority`). On the way out, telemetry is flushed and
    Jaeger must have received spans.
    """
    services = LocalStack()
    try:
        services.start("kafka", "redis", "jaeger")
        kafka, redis, jaeger = services.kafka, services.redis, services.jaeger
        if not own_cpu_for_jaeger:
            lowest_priority(jaeger.process.pid)
        os.environ["OTEL_METRICS_EXPORTER"] = "none"  # Jaeger takes traces only
        os.environ["OTEL_SERVICE_NAME"] = "bench-worker"
        configured = configure(
            pod="bench-pod",
            otlp_endpoint=jaeger.otlp_http_endpoint,
            metrics_port=0,
            metrics_host="127.0.0.1",
        )
        compared = sdk_batch_telemetry(configured, jaeger.otlp_http_endpoint) if sdk_batch else None
        yield Stack(kafka, redis, jaeger, configured, compared)
        if compared is not None:
            compared[1].shutdown()
        await configured.aclose()
        assert jaeger.find_traces("bench-worker", limit=10), "no spans reached Jaeger"
    finally:
        services.stop()


async def measure(
    triggers: int,
    rounds: int,
    job_seconds: list[float],
    store_url: str,
    *,
    tune_gc: bool,
    breakdown: bool,
    sdk_batch: bool = False,
    own_cpu_for_jaeger: bool = False,
) -> Samples:
    """Alternate the sides' rounds, for each job time, against private Kafka, Redis and Jaeger."""
    samples: Samples = {}
    clock = CollectorClock()
    async with stack(sdk_batch, own_cpu_for_jaeger) as services:
        kafka, redis = services.kafka, services.redis
        cpu = CpuClock(services.pids())
        tracer_provider = services.configured.tracer_provider
        await one_round(kafka, redis, min(triggers, 100), None, 0.0, store_url)  # warm-up
        if tune_gc:
            tune_garbage_collector()
        for seconds in job_seconds:
            sides = services.sides(breakdown)
            samples[seconds] = {side: [] for side in sides}
            for _ in range(rounds):
                for side, telemetry in sides.items():
                    topic = await fresh_topic(kafka, triggers)
                    collected, used = clock.total, cpu.read()  # the worker's run only
                    dropped = dropped_spans(tracer_provider)
                    interval = sys.getswitchinterval()
                    if side == ON_SLOW_SWITCH:
                        sys.setswitchinterval(0.005)
                    try:
                        rate = await run_worker(
                            kafka, redis, topic, triggers, telemetry, seconds, store_url
                        )
                    finally:
                        sys.setswitchinterval(interval)
                    flushed = tracer_provider
                    if side == ON_SDK_BATCH and services.sdk_batch is not None:
                        flushed = services.sdk_batch[1]
                    if telemetry is not None and flushed is not None:
                        # the export of this side's spans is part of its cost
                        await anyio.to_thread.run_sync(flushed.force_flush)
                    spent = {
                        name: (value - used[name]) / triggers for name, value in cpu.read().items()
                    }
                    dropped = dropped_spans(tracer_provider) - dropped
                    samples[seconds][side].append(
                        Round(rate, clock.total - collected, spent, dropped)
                    )
    return samples


def dropped_spans(provider: LeanTracerProvider | None) -> int:
    """Spans the provider's lean batch processors dropped so far."""
    processors = () if provider is None else provider.processors
    return sum(getattr(processor, "dropped", 0) for processor in processors)


async def count_calls(triggers: int, store_url: str) -> dict[str, tuple[float, float]]:
    """Return, per side, Python calls per trigger: all of them and telemetry's own."""
    counter = CallCounter()  # before telemetry starts its export thread
    counts: dict[str, tuple[float, float]] = {}
    async with stack() as services:
        kafka, redis, configured = services.kafka, services.redis, services.configured
        await one_round(kafka, redis, min(triggers, 100), None, 0.0, store_url)  # warm-up
        for side, telemetry in (("off", None), ("on", configured.telemetry)):
            topic = await fresh_topic(kafka, triggers)
            with counter.counting():
                await run_worker(kafka, redis, topic, triggers, telemetry, 0.0, store_url)
                if configured.tracer_provider is not None:  # the export thread's share too
                    await anyio.to_thread.run_sync(configured.tracer_provider.force_flush)
            counts[side] = (counter.calls / triggers, counter.telemetry / triggers)
    return counts


def main() -> None:
    """Measure and print, per job time, the medians and the on/off ratio (and a JSON line)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--triggers", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--store-url",
        default="memory://",
        help="completion store of both sides (default: memory://, no database)",
    )
    parser.add_argument(
        "--job-seconds",
        default="0",
        help="simulated I/O per job; a comma-separated list measures each (default 0)",
    )
    parser.add_argument(
        "--no-gc-tuning",
        action="store_true",
        help="leave the garbage collector as it is (leaseworker run tunes it)",
    )
    parser.add_argument(
        "--count-calls",
        action="store_true",
        help="count Python calls per trigger (one no-op round per side) instead of timing",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also run a control off side, metrics only, and spans not exported (see above)",
    )
    parser.add_argument(
        "--sdk-batch",
        action="store_true",
        help="also run a side exporting through the SDK's BatchSpanProcessor (paired)",
    )
    parser.add_argument(
        "--jaeger-own-cpu",
        action="store_true",
        help="run Jaeger at the pod's CPU priority (default: nice 19, as if on another machine)",
    )
    parser.add_argument(
        "--sample-ratio",
        type=float,
        default=None,
        help="trace this fraction of triggers (default: all, the SDK's default sampler)",
    )
    args = parser.parse_args()
    job_seconds = [float(part) for part in args.job_seconds.split(",")]
    if args.sample_ratio is not None:
        os.environ["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
        os.environ["OTEL_TRACES_SAMPLER_ARG"] = str(args.sample_ratio)
    if args.count_calls:
        counts = anyio.run(count_calls, args.triggers, args.store_url)
        report_calls(counts, args.sample_ratio)
        return
    tune_gc = not args.no_gc_tuning
    results = anyio.run(
        functools.partial(
            measure,
            args.triggers,
            args.rounds,
            job_seconds,
            args.store_url,
            tune_gc=tune_gc,
            breakdown=args.breakdown,
            sdk_batch=args.sdk_batch,
            own_cpu_for_jaeger=args.jaeger_own_cpu,
        )
    )
    lines = [
        report(seconds, samples, args.triggers, args.sample_ratio, tune_gc)
        for seconds, samples in results.items()
    ]
    for line in lines:
        print(json.dumps(line))


CPU_PARTS = ("pod main", "pod other", "kafka", "redis", "jaeger")


def report(
    seconds: float,
    samples: dict[str, list[Round]],
    triggers: int,
    sample_ratio: float | None,
    tune_gc: bool,
) -> dict[str, object]:
    """Print one job time's result block (a line per side); return its JSON line."""
    sampling = "all" if sample_ratio is None else str(sample_ratio)
    print(f"job {seconds * 1000:5.0f} ms, traces sampled: {sampling}, gc tuned: {tune_gc}")
    print(
        f"  {'side':14} {'executions/s':>12}  {'paired ratio (rounds)':22} {'gc ms/1k':>8}"
        f"  CPU µs per trigger: {', '.join(CPU_PARTS)}"
    )
    off_rounds = samples["off"]
    sides: dict[str, dict[str, object]] = {}
    for side, rounds in samples.items():
        rate = statistics.median(r.rate for r in rounds)
        paired = sorted(r.rate / o.rate for r, o in zip(rounds, off_rounds, strict=True))
        gc_ms = statistics.median(r.gc_seconds for r in rounds) * 1e6 / triggers
        cpu = {part: statistics.median(r.cpu[part] for r in rounds) * 1e6 for part in CPU_PARTS}
        dropped = sum(r.dropped for r in rounds)
        ratio = (
            ""
            if side == "off"
            else (f"{statistics.median(paired):.3f} ({paired[0]:.2f}..{paired[-1]:.2f})")
        )
        print(
            f"  {side:14} {rate:12.1f}  {ratio:22} {gc_ms:8.0f}"
            f"  {' / '.join(f'{value:.0f}' for value in cpu.values())}"
            + (f"  ({dropped} spans dropped)" if dropped else "")
        )
        sides[side] = {
            "rate": round(rate, 1),
            "rounds": _rounded([r.rate for r in rounds]),
            "paired_ratio": round(statistics.median(paired), 3),
            "gc_ms_per_1k": round(gc_ms, 1),
            "cpu_us_per_trigger": {part: round(value) for part, value in cpu.items()},
            "dropped_spans": dropped,
        }
    off = statistics.median(r.rate for r in off_rounds)
    on = statistics.median(r.rate for r in samples["on"])
    print(
        f"  on/off: {on / off:.3f} (ratio of medians); "
        f"paired: {sides['on']['paired_ratio']} (median of each round's own); target >= 0.90"
    )
    return {
        "job_seconds": seconds,
        "sample_ratio": sample_ratio,
        "gc_tuned": tune_gc,
        "off": off,
        "on": on,
        "ratio": round(on / off, 3),
        "paired_ratio": sides["on"]["paired_ratio"],
        "sides": sides,
    }


def report_calls(counts: dict[str, tuple[float, float]], sample_ratio: float | None) -> None:
    """Print the calls per trigger of each side, and a JSON line."""
    (off, _), (on, on_telemetry) = counts["off"], counts["on"]
    sampling = "all" if sample_ratio is None else str(sample_ratio)
    print(f"no-op jobs, traces sampled: {sampling}; Python function calls per trigger")
    print(f"  telemetry off: {off:7.0f}")
    print(f"  telemetry on : {on:7.0f}  (in telemetry code: {on_telemetry:.0f})")
    print(f"  on/off       : {on / off:.3f}x  (a throughput ratio of 0.9 allows about 1.11x)")
    line = {"sample_ratio": sample_ratio, "calls_off": off, "calls_on": on}
    print(json.dumps({**line, "calls_telemetry": on_telemetry, "ratio": round(on / off, 3)}))


def _rounded(values: list[float]) -> list[float]:
    return [round(value, 1) for value in values]


if __name__ == "__main__":
    main()
