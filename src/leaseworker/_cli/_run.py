"""``leaseworker run pkg.module:JobClass``: run a worker pod for one job class.

Flags map onto :class:`WorkerConfig`; each can also come from its
``LEASEWORKER_*`` environment variable. A bad flag, an unimportable job class
or settings that cannot keep the lease exit 2 with a one-line reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import importlib
import inspect
import os
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from .._errors import ConfigError
from .._execution import ReportJob
from .._telemetry import ConfiguredTelemetry
from .._version import __version__
from .._worker import HealthServer, Worker, WorkerConfig, serve, serve_with_health
from ._common import (
    LOG_FORMATS,
    env_default,
    env_name,
    env_switch,
    flag,
    port,
    positive_int,
    positive_seconds,
)
from ._kafka_flags import add_kafka_security_flags, kafka_security_from


def add_parser(subparsers: Any) -> None:
    """Register the ``run`` subcommand."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "run",
        help="run a worker pod for a ReportJob class",
        description="Consume the job's topic in a consumer group and run each trigger's job "
        "under its Redis lease. SIGTERM drains; a second SIGTERM exits at once.",
    )
    parser.add_argument("--version", action="version", version=f"leaseworker {__version__}")
    parser.add_argument("job", metavar="pkg.module:JobClass", help="the ReportJob subclass to run")
    flag(
        parser, "--bootstrap-servers", "127.0.0.1:9092", "Kafka bootstrap servers, host:port[,...]"
    )
    flag(parser, "--redis-url", "redis://127.0.0.1:6379/0", "Redis URL for the leases")
    flag(parser, "--group", "leaseworker", "Kafka consumer group id")
    flag(parser, "--pod", socket.gethostname(), "this pod's name in logs and lease owners")
    flag(parser, "--namespace", "leaseworker", "lease key prefix in Redis")
    flag(parser, "--concurrency", "4", "executions running at once in this pod", positive_int)
    flag(
        parser,
        "--shutdown-timeout",
        "30",
        "seconds in-flight jobs get after SIGTERM",
        positive_seconds,
    )
    flag(
        parser,
        "--dead-letter-topic",
        None,
        "topic for malformed, failed and timed-out triggers; unset: log and skip them",
    )
    flag(
        parser,
        "--session-timeout",
        "10",
        "seconds before the group drops a silent pod",
        positive_seconds,
    )
    _add_store_flags(parser)
    _add_tuning_flags(parser)
    add_kafka_security_flags(parser)
    _add_health_flags(parser)
    _add_telemetry_flags(parser)
    parser.set_defaults(handler=_run)


def _add_store_flags(parser: argparse.ArgumentParser) -> None:
    """Add the fenced completion store flags (docs/completion.md)."""
    flag(
        parser,
        "--store-url",
        _config_default("--store-url"),
        "completion store: postgresql://user:pw@host/db or sqlite:///path; the default is "
        "an embedded SQLite file in the working directory (one per host: share a "
        "PostgreSQL database between pods)",
    )
    flag(
        parser,
        "--store-timeout",
        _config_default("--store-timeout"),
        "seconds a completion store call may take",
        positive_seconds,
    )


def _add_tuning_flags(parser: argparse.ArgumentParser) -> None:
    """Kafka timing, payload bound and call timeouts (defaults: WorkerConfig's)."""
    flag(
        parser,
        "--heartbeat-interval",
        None,
        "seconds between group heartbeats; unset: session timeout / 5",
        positive_seconds,
    )
    for name, text in (
        ("--max-poll-interval", "seconds one poll-loop turn may take before the pod is evicted"),
        ("--revoke-timeout", "seconds revoked partitions' executions get in a rebalance"),
        ("--commit-timeout", "seconds an offset commit may take"),
        ("--kafka-timeout", "seconds any other Kafka request may take"),
        ("--redis-timeout", "seconds a Redis command may take"),
    ):
        flag(parser, name, _config_default(name), text, positive_seconds)
    flag(
        parser,
        "--max-payload-bytes",
        _config_default("--max-payload-bytes"),
        "larger trigger payloads are dead-lettered as too_large",
        positive_int,
    )
    parser.add_argument(
        "--no-lease-pipelining",
        action="store_true",
        help="send every lease call to Redis on its own instead of queueing the calls made "
        "while one is in flight into one pipeline "
        f"(env {env_name('--no-lease-pipelining')}=1; default: pipelined)",
    )


def _add_health_flags(parser: argparse.ArgumentParser) -> None:
    """Add the /healthz and /readyz endpoint flags (off unless a port is given)."""
    flag(parser, "--health-port", None, "serve /healthz and /readyz on this port", port)
    flag(parser, "--health-host", "0.0.0.0", "address the health endpoints listen on")
    flag(
        parser,
        "--stall-threshold",
        "10",
        "seconds of event-loop lag after which /healthz answers 503",
        positive_seconds,
    )


def _add_telemetry_flags(parser: argparse.ArgumentParser) -> None:
    """Add OTLP export, the Prometheus endpoint and the log format (docs/telemetry.md)."""
    flag(
        parser,
        "--otlp-endpoint",
        None,
        "OTLP/HTTP endpoint for traces and metrics, e.g. http://collector:4318 "
        "(also $OTEL_EXPORTER_OTLP_ENDPOINT); unset: nothing is exported",
    )
    flag(parser, "--metrics-port", None, "serve Prometheus metrics on this port", port)
    parser.add_argument(
        "--log-format",
        default=env_default("--log-format", "text"),
        type=str.lower,
        choices=LOG_FORMATS,
        help=f"log line format (env {env_name('--log-format')}; default text)",
    )
    parser.add_argument(
        "--log-job-errors",
        action="store_true",
        help="also log a failed job's exception message and traceback, which may quote "
        f"payload data (env {env_name('--log-job-errors')}=1; default off)",
    )


def _config_default(flag: str) -> str:
    """WorkerConfig's default for the field behind ``flag``, as flag text."""
    name = flag.lstrip("-").replace("-", "_")
    [found] = [f for f in dataclasses.fields(WorkerConfig) if f.name == name]
    return str(found.default)


def load_job_class(spec: str) -> type[ReportJob]:
    """Import ``pkg.module:JobClass`` and check it is a concrete ReportJob subclass.

    The current directory is put on ``sys.path`` first (as ``python -m`` does),
    so jobs in the project being deployed import without installing it. Raises
    :class:`ConfigError` with a one-line reason.
    """
    module_name, sep, class_name = spec.partition(":")
    if not sep or not module_name or not class_name:
        raise ConfigError(f"job must look like pkg.module:JobClass, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or anything the module raises at import
        raise ConfigError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
    job_class = getattr(module, class_name, None)
    if not (inspect.isclass(job_class) and issubclass(job_class, ReportJob)):
        raise ConfigError(f"{spec} is not a ReportJob subclass")
    if inspect.isabstract(job_class):
        raise ConfigError(f"{spec} is abstract: implement async def run(self, ctx)")
    return job_class


def build_config(args: argparse.Namespace) -> WorkerConfig:
    """Map the parsed ``run`` flags onto a :class:`WorkerConfig` (raises ConfigError)."""
    return WorkerConfig(
        bootstrap_servers=args.bootstrap_servers,
        redis_url=args.redis_url,
        group=args.group,
        pod=args.pod,
        namespace=args.namespace,
        concurrency=args.concurrency,
        shutdown_timeout=args.shutdown_timeout,
        dead_letter_topic=args.dead_letter_topic or None,
        session_timeout=args.session_timeout,
        heartbeat_interval=args.heartbeat_interval,
        max_poll_interval=args.max_poll_interval,
        revoke_timeout=args.revoke_timeout,
        commit_timeout=args.commit_timeout,
        kafka_timeout=args.kafka_timeout,
        redis_timeout=args.redis_timeout,
        store_url=args.store_url,
        store_timeout=args.store_timeout,
        max_payload_bytes=args.max_payload_bytes,
        kafka_security=kafka_security_from(args),
        log_job_errors=args.log_job_errors or env_switch("--log-job-errors"),
        lease_pipelining=not (args.no_lease_pipelining or env_switch("--no-lease-pipelining")),
    )


def _run(args: argparse.Namespace) -> int:
    try:
        job = load_job_class(args.job)()
        config = build_config(args)
        telemetry = _telemetry(args, config.pod)
        worker = Worker(job, config, telemetry=telemetry.telemetry)
        health = (
            None if args.health_port is None else HealthServer(args.health_host, args.health_port)
        )
    except ConfigError as exc:
        print(f"leaseworker run: error: {exc}", file=sys.stderr)
        return 2
    tune_garbage_collector()
    if health is None:
        anyio.run(_then_flush, functools.partial(serve, worker), telemetry)
        return 0
    try:
        anyio.run(
            _then_flush,
            functools.partial(
                serve_with_health,
                worker,
                health,
                pod=config.pod,
                stall_threshold=args.stall_threshold,
            ),
            telemetry,
        )
    finally:
        health.close()
    return 0


YOUNG_COLLECTION_THRESHOLD = 10_000
"""Net new container objects between two collections of the youngest generation.

CPython's default is 700. Most of a pod's objects die young by reference
counting and are never traversed; the survivors (in-flight triggers, spans
queued for export) are traversed again at every young collection, so fewer
collections traverse them less often. Measured with no-op jobs and telemetry
on: 60 ms of collection per 1,000 triggers at 700 and 7 at 10,000, the
process's peak memory 61.1 and 61.6 MB (``bench/telemetry_overhead.py``).
"""


def tune_garbage_collector() -> None:
    """Keep the garbage collector off the event loop as much as a pod safely can.

    Why: collections run on the event loop, taking their time from renewals
    and jobs alike. First, the start-up heap (aiokafka, redis-py, the
    OpenTelemetry SDK, settings: objects that live as long as the process) is
    frozen (``gc.freeze``), so full collections stop traversing it (telemetry
    on, 1 % traced: 59 ms of collection per 1,000 triggers before, 25 after);
    reference counting still frees frozen objects. Then young collections
    come less often (:data:`YOUNG_COLLECTION_THRESHOLD`). Called once, by
    ``leaseworker run``, after set-up and before serving: a library embedding
    a worker leaves its host's collector alone.
    """
    gc.collect()  # what start-up already dropped is freed, not frozen
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, old)


def _telemetry(args: argparse.Namespace, pod: str) -> ConfiguredTelemetry:
    """Set up OTLP/Prometheus export from the flags and OTEL_* (ConfigError if impossible)."""
    from .._telemetry import configure

    try:
        return configure(pod=pod, otlp_endpoint=args.otlp_endpoint, metrics_port=args.metrics_port)
    except OSError as exc:  # the metrics port is taken, say
        raise ConfigError(f"cannot serve metrics on port {args.metrics_port}: {exc}") from exc


async def _then_flush(
    serving: Callable[[], Awaitable[None]], telemetry: ConfiguredTelemetry
) -> None:
    """Run ``serving``, then flush telemetry off the event loop (bounded)."""
    try:
        await serving()
    finally:
        await telemetry.aclose()
