"""``leaseworker run pkg.module:JobClass``: run a worker pod for one job class.

Every flag is one row of :data:`RUN_SETTINGS` (flag, help, type, and the
:class:`PodConfig` field it sets, whose default it shows); each can also
come from its ``LEASEWORKER_*`` environment variable. A bad flag, an
unimportable job class or settings that cannot keep the lease exit 2 with a
one-line reason.
"""

from __future__ import annotations

import argparse
import functools
import gc
import inspect
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from .._errors import ConfigError
from .._execution import ReportJob
from .._telemetry import ConfiguredTelemetry
from .._worker import (
    HealthServer,
    HistoryRecorder,
    Pod,
    PodConfig,
    serve,
    serve_with_health,
)
from ._common import (
    LOG_FORMATS,
    REDIS_TLS_SETTINGS,
    Setting,
    Switch,
    config_default,
    dest,
    job_parser,
    non_negative_int,
    port,
    positive_int,
    positive_seconds,
    redis_url_with_tls,
)
from ._jobs import load_job_class
from ._kafka_flags import KAFKA_SECURITY_SETTINGS, add_deprecated_kafka_flags, kafka_security_from


def _field(
    flag: str, help: str, kind: Callable[[str], Any] = str, *, secret: bool = False
) -> Setting:
    """Make the row of a flag that sets the PodConfig field of its name (and its default).

    ``secret``: it may come from a file too (``<flag>-file``), which the pod reads again
    on every reconnect (PodConfig's ``<field>_file``).
    """
    name = dest(flag)
    default = config_default(name)
    return Setting(flag=flag, help=help, default=default, kind=kind, field=name, secret=secret)


def _mebibytes(text: str) -> int:
    """Parse a flag value as a whole number of MiB >= 1 and return it in bytes."""
    return positive_int(text) * 2**20


RUN_SETTINGS: tuple[Setting | Switch, ...] = (
    _field("--bootstrap-servers", "Kafka bootstrap servers, host:port[,...]"),
    _field("--redis-url", "Redis URL for the leases", secret=True),
    *REDIS_TLS_SETTINGS,  # added to the URL's query (redis_url_with_tls)
    _field("--group", "Kafka consumer group id"),
    _field("--pod", "this pod's name in logs and lease owners"),
    _field("--namespace", "lease key prefix in Redis"),
    _field("--concurrency", "executions running at once in this pod", positive_int),
    _field("--shutdown-timeout", "seconds in-flight jobs get after SIGTERM", positive_seconds),
    _field(
        "--dead-letter-topic",
        "topic for malformed, failed and timed-out triggers; unset: log and skip them",
    ),
    _field("--session-timeout", "seconds before the group drops a silent pod", positive_seconds),
    # The fenced completion store (docs/completion.md).
    _field(
        "--store-url",
        "completion store: postgresql://user:pw@host/db or sqlite:///path; the default is "
        "an embedded SQLite file in the working directory (one per host: share a "
        "PostgreSQL database between pods)",
        secret=True,
    ),
    _field("--store-timeout", "seconds a completion store call may take", positive_seconds),
    _field(
        "--outbox-retention",
        "seconds a sent outbox message is kept (for inspect) before it is deleted",
        positive_seconds,
    ),
    _field(
        "--outbox-claim-timeout",
        "seconds a relay's claim on unsent messages lasts: how long a dead pod's "
        "messages wait for another pod's relay",
        positive_seconds,
    ),
    _field(
        "--outbox-relay-connections",
        "PostgreSQL connections (of the pod's 10) its relay may hold at once, the rest "
        "kept for the jobs while a backlog drains; unset: 4",
        positive_int,
    ),
    # Kafka timing, call timeouts, the payload bound, lease pipelining.
    _field(
        "--heartbeat-interval",
        "seconds between group heartbeats; unset: session timeout / 5",
        positive_seconds,
    ),
    _field(
        "--max-poll-interval",
        "seconds one poll-loop turn may take before the pod is evicted",
        positive_seconds,
    ),
    _field(
        "--revoke-timeout",
        "seconds revoked partitions' executions get in a rebalance",
        positive_seconds,
    ),
    _field("--commit-timeout", "seconds an offset commit may take", positive_seconds),
    _field("--kafka-timeout", "seconds any other Kafka request may take", positive_seconds),
    _field("--redis-timeout", "seconds a Redis command may take", positive_seconds),
    _field(
        "--max-payload-bytes",
        "larger trigger payloads are dead-lettered as too_large",
        positive_int,
    ),
    Setting(
        flag="--lease-replicas",
        help="replicas that must acknowledge every lease acquire and renewal (Redis WAIT); "
        "unset: 1 on redis+sentinel:// and redis+cluster:// URLs, 0 on one node",
        kind=non_negative_int,
        field="lease_replicas",
    ),
    Switch(
        flag="--no-lease-pipelining",
        help="send every lease call to Redis on its own instead of queueing the calls made "
        "while one is in flight into one pipeline",
        field="lease_pipelining",
        sets=False,
        shown="default: pipelined",
    ),
    Setting(
        flag="--loss-budget",
        help="executions of one trigger that may lose their lease in a row before it is "
        "dead-lettered as lost_repeatedly; unset: the job class's loss_budget (5 by default)",
        kind=positive_int,
        field="loss_budget",
    ),
    Setting(
        flag="--max-result-bytes",
        help="larger job results (as JSON) are dead-lettered as bad_result; unset: the job "
        "class's max_result_bytes (1 MiB by default)",
        kind=positive_int,
        field="max_result_bytes",
    ),
    Setting(
        flag="--process-workers",
        help="child processes ctx.run_in_process runs the job's blocking work in, started "
        "with the pod; unset: the machine's cores; 0: none (run_in_process then fails)",
        kind=non_negative_int,
        field="process_workers",
    ),
    Setting(
        flag="--max-tasks-per-child",
        help="calls a process worker runs before it is replaced; unset: no limit",
        kind=positive_int,
        field="max_tasks_per_child",
    ),
    Setting(
        flag="--max-memory-per-child",
        help="MiB of peak memory above which a process worker is replaced after its call; "
        "unset: no limit",
        kind=_mebibytes,
        field="max_memory_per_child",
    ),
    *KAFKA_SECURITY_SETTINGS,  # into PodConfig.kafka_security (kafka_security_from)
    # The /healthz and /readyz endpoints, off unless a port is given.
    Setting(flag="--health-port", help="serve /healthz and /readyz on this port", kind=port),
    Setting(flag="--health-host", default="0.0.0.0", help="address the health endpoints listen on"),
    Setting(
        flag="--stall-threshold",
        default="10",
        help="seconds of event-loop lag after which /healthz answers 503",
        kind=positive_seconds,
    ),
    # OTLP export, the Prometheus endpoint and the logs (docs/telemetry.md).
    Setting(
        flag="--otlp-endpoint",
        help="OTLP/HTTP endpoint for traces, e.g. http://collector:4318 "
        "(also $OTEL_EXPORTER_OTLP_ENDPOINT); unset: nothing is exported. Metrics go over "
        "OTLP only with $OTEL_EXPORTER_OTLP_METRICS_ENDPOINT or $OTEL_METRICS_EXPORTER=otlp "
        "(Jaeger takes traces only)",
    ),
    Setting(flag="--metrics-port", help="serve Prometheus metrics on this port", kind=port),
    Setting(
        flag="--log-format",
        default="text",
        help="log line format",
        kind=str.lower,
        choices=LOG_FORMATS,
    ),
    # The execution recorder the fault campaign checks (docs/chaos.md).
    Setting(
        flag="--record-history",
        help="append every execution's start and stop (monotonic clock, job key, execution "
        "id, fence, outcome, completion answer, Kafka offset; never payloads) to this file",
    ),
    Setting(
        flag="--metrics-host",
        default="0.0.0.0",
        help="address the Prometheus endpoint listens on",
    ),
    Setting(
        flag="--auto-offset-reset",
        help="where a consumer group with no committed offset starts: earliest (every "
        "trigger still on the topic) or latest (only triggers sent from now on)",
        default=config_default("auto_offset_reset"),
        choices=("earliest", "latest"),
        field="auto_offset_reset",
    ),
    Switch(
        flag="--log-job-errors",
        help="also log a failed job's exception message and traceback, which may quote "
        "payload data",
        field="log_job_errors",
        sets=True,
        shown="default off",
    ),
)
"""Every ``run`` flag in ``--help`` order: its env var, help text, default and target.

A row with a ``field`` sets that :class:`PodConfig` field (:func:`build_config`)
and takes its default from it; the others are read by :func:`_run`. A new
setting is one row here (and its field).
"""


def add_parser(subparsers: Any, summary: str) -> None:
    """Register the ``run`` subcommand with the flags of :data:`RUN_SETTINGS`."""
    parser = job_parser(
        subparsers,
        "run",
        summary,
        "Consume the job's topic in a consumer group and run each trigger's job "
        "under its Redis lease. SIGTERM drains; a second SIGTERM exits at once. Redis, "
        "Kafka and the store are waited for while they are not up; what waiting cannot fix "
        "(credentials Redis refuses, a missing topic, an unusable store URL) exits 2.",
    )
    for setting in RUN_SETTINGS:
        setting.add_to(parser)
    add_deprecated_kafka_flags(parser)
    parser.set_defaults(handler=_run)


def make_job(job_class: type[ReportJob]) -> ReportJob:
    """Construct the pod's one job instance, or raise :class:`ConfigError` with one line.

    The worker makes the instance itself, with no arguments: a constructor
    that needs some, or raises, is a mistake to name at start.
    """
    name = job_class.__qualname__
    try:
        inspect.signature(job_class).bind()
    except TypeError as exc:
        raise ConfigError(f"{name}() must take no arguments: {exc}") from None
    except ValueError:  # no signature to read (a C type): let the call say
        pass
    try:
        return job_class()
    except Exception as exc:
        raise ConfigError(f"{name}() raised {type(exc).__name__}: {exc}") from exc


def build_config(args: argparse.Namespace) -> PodConfig:
    """Map the parsed ``run`` flags onto a :class:`PodConfig` (raises ConfigError)."""
    fields: dict[str, Any] = {
        row.field: row.value(args) for row in RUN_SETTINGS if row.field is not None
    }
    for row in RUN_SETTINGS:
        if isinstance(row, Setting) and row.secret and row.field is not None:
            source = row.file(args)
            fields[f"{row.field}_file"] = None if source is None else source.path
    fields["redis_url"] = redis_url_with_tls(args, fields["redis_url"])
    return PodConfig(**fields, kafka_security=kafka_security_from(args))


def _run(args: argparse.Namespace) -> int:
    try:
        job = make_job(load_job_class(args.job))
        config = build_config(args)
        recorder = _recorder(args, job)
        telemetry = _telemetry(args, config.pod)
        worker = Pod(job, config, telemetry=telemetry.telemetry, recorder=recorder)
        health = (
            None if args.health_port is None else HealthServer(args.health_host, args.health_port)
        )
    except ConfigError as exc:
        print(f"leaseworker run: error: {exc}", file=sys.stderr)
        return 2
    tune_garbage_collector()
    try:
        _serve(worker, health, telemetry, pod=config.pod, stall_threshold=args.stall_threshold)
    except BaseException as exc:
        problem = setting_error(exc)
        if problem is None:
            raise
        print(f"leaseworker run: error: {problem}", file=sys.stderr)
        return 2
    return 0


def _serve(
    worker: Pod,
    health: HealthServer | None,
    telemetry: ConfiguredTelemetry,
    *,
    pod: str,
    stall_threshold: float,
) -> None:
    if health is None:
        anyio.run(_then_flush, functools.partial(serve, worker), telemetry)
        return
    try:
        anyio.run(
            _then_flush,
            functools.partial(
                serve_with_health, worker, health, pod=pod, stall_threshold=stall_threshold
            ),
            telemetry,
        )
    finally:
        health.close()


def setting_error(exc: BaseException) -> ConfigError | None:
    """Return the :class:`ConfigError` that ended a pod, found inside task groups' errors.

    Start-up problems that waiting cannot fix (credentials, a missing topic)
    surface while serving, wrapped in the exception groups of the task groups
    they crossed; anything else (a bug, Ctrl-C) is not one of them: ``None``.
    """
    if isinstance(exc, ConfigError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = setting_error(inner)
            if found is not None:
                return found
    return None


YOUNG_COLLECTION_THRESHOLD = 10_000
"""Net new container objects between two collections of the youngest generation.

CPython's default is 700. Most of a pod's objects die young by reference
counting and are never traversed; the survivors (in-flight triggers, spans
queued for export) are traversed again at every young collection, so fewer
collections traverse them less often, for little more peak memory
(figures: docs/telemetry.md#overhead, ``bench/telemetry_overhead.py``).
"""


def tune_garbage_collector() -> None:
    """Keep the garbage collector off the event loop as much as a pod safely can.

    Why: collections run on the event loop, taking their time from renewals
    and jobs alike. First, the start-up heap (aiokafka, redis-py, the
    OpenTelemetry SDK, settings: objects that live as long as the process) is
    frozen (``gc.freeze``), so full collections stop traversing it (figures:
    docs/telemetry.md#overhead);
    reference counting still frees frozen objects. Then young collections
    come less often (:data:`YOUNG_COLLECTION_THRESHOLD`). Called once, by
    ``leaseworker run``, after set-up and before serving: a library embedding
    a worker leaves its host's collector alone.
    """
    gc.collect()  # what start-up already dropped is freed, not frozen
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, old)


def _recorder(args: argparse.Namespace, job: ReportJob) -> HistoryRecorder | None:
    """Open the ``--record-history`` file, if one is given (ConfigError if impossible)."""
    path = args.record_history
    if not path:
        return None
    try:
        return HistoryRecorder(Path(path), input_version=job.input_version)
    except OSError as exc:
        raise ConfigError(f"cannot record the history to {path}: {exc.strerror}") from exc


def _telemetry(args: argparse.Namespace, pod: str) -> ConfiguredTelemetry:
    """Set up OTLP/Prometheus export from the flags and OTEL_* (ConfigError if impossible)."""
    from .._telemetry import configure

    try:
        return configure(
            pod=pod,
            otlp_endpoint=args.otlp_endpoint,
            metrics_port=args.metrics_port,
            metrics_host=args.metrics_host,
            check_collector=True,  # a collector refusing the spans (401/403, TLS) exits 2
        )
    except OSError as exc:  # the metrics port is taken, say
        raise ConfigError(
            f"cannot serve metrics on {args.metrics_host}:{args.metrics_port}: {exc}"
        ) from exc


async def _then_flush(
    serving: Callable[[], Awaitable[None]], telemetry: ConfiguredTelemetry
) -> None:
    """Run ``serving``, then flush telemetry off the event loop (bounded)."""
    try:
        await serving()
    finally:
        await telemetry.aclose()
