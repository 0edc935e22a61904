"""``leaseworker chaos pkg.module:JobClass``: a seeded fault campaign against your own job.

Parses the flags, loads the job class and the payload generator (exit 2 with
a one-line reason if either is wrong), runs the campaign
(:mod:`leaseworker_dev._campaign`), prints the report and writes the JSON and HTML
files asked for. Exit 0 when every invariant held, 1 on any violation or
when the campaign barely exercised the job (inconclusive: one line on stderr
says why). See docs/chaos.md.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from leaseworker.toolkit import (
    ConfigError,
    add_kafka_security_flags,
    job_parser,
    kafka_security_from,
    non_negative_int,
    positive_int,
)

TOPOLOGIES = ("single", "sentinel", "cluster")


def add_parser(subparsers: Any, summary: str) -> None:
    """Register the ``chaos`` subcommand."""
    parser = job_parser(
        subparsers,
        "chaos",
        summary,
        "Start a local Kafka, Redis and completion store, run N `leaseworker run` "
        "pods of the job, send triggers while injecting random faults (from the seed), heal, "
        "drain, stop the pods and check the recorded history: no overlap, fences increase, "
        "one completion per identity, nothing lost, no crash, every effect delivered and "
        "processed once, none stale. Exit 1 on any violation, or when too few executions, "
        "completions or faults striking a running job made the campaign inconclusive.",
    )
    add = parser.add_argument
    add("--faults", type=non_negative_int, default=20, help="faults to inject (default 20)")
    add("--seed", type=int, default=1, help="seed of every random choice (default 1)")
    add("--pods", type=positive_int, default=3, help="worker pods (default 3)")
    add("--concurrency", type=positive_int, default=4, help="executions per pod (default 4)")
    add("--keys", type=positive_int, default=8, help="distinct job keys (default 8)")
    add(
        "--store-url",
        help="completion store the pods share (default: a private PostgreSQL this command "
        "starts, or an SQLite file if PostgreSQL is not installed)",
    )
    add("--topology", choices=TOPOLOGIES, default="single", help="Redis deployment")
    add(
        "--bootstrap-servers",
        help="Kafka brokers to use instead of a local one (with the SASL/TLS flags below); "
        "the campaign then plays no broker faults",
    )
    add(
        "--kafka-brokers",
        type=int,
        choices=(1, 3),
        default=1,
        help="3: run on three local brokers (RF 3, min.insync.replicas 2) and kill one, "
        "or restart all in turn, instead of restarting the one broker",
    )
    add(
        "--hosts",
        action="store_true",
        help="run Redis, Kafka, the store and each pod on a network namespace of its own "
        "(root, iproute2, nftables; single topology, local services) and cut pods apart: "
        "pod_cut_redis and pod_isolate instead of the Redis proxy faults and store_outage",
    )
    add(
        "--postgres-standby",
        choices=("sync", "async"),
        help="run the store on a local PostgreSQL primary and streaming standby (commits "
        "waiting for it, or not) and kill the primary, promoting the standby",
    )
    add_kafka_security_flags(parser)
    add(
        "--payloads",
        metavar="pkg.module:function",
        help="trigger generator: (rng, key index, version) -> (record key, payload dict); "
        "default: key report:tenant-<k>:2026-11 with tenant, period, inputVersion, rows",
    )
    add("--report", type=Path, metavar="FILE.json", help="write the report as JSON here")
    add("--html", type=Path, metavar="FILE.html", help="write the timeline page here")
    parser.set_defaults(handler=_chaos)


def _chaos(args: argparse.Namespace) -> int:
    from leaseworker.toolkit import load_job_class

    from .._campaign import (
        Interrupted,
        Settings,
        load_generator,
        render,
        run_campaign,
        to_html,
        to_json,
    )

    # First: a broker restart is a fault played, and loading a CA file logs at INFO.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        settings = Settings(
            job=args.job,
            job_class=load_job_class(args.job),
            payloads=load_generator(args.payloads),
            payloads_spec=args.payloads,
            faults=args.faults,
            seed=args.seed,
            pods=args.pods,
            concurrency=args.concurrency,
            keys=args.keys,
            store_url=args.store_url,
            topology=args.topology,
            bootstrap_servers=args.bootstrap_servers or None,
            kafka_security=kafka_security_from(args),
            kafka_brokers=args.kafka_brokers,
            hosts=args.hosts,
            postgres_standby=args.postgres_standby,
        )
        _check_flags(settings)  # first: flags that cannot go together, then this machine
        _check_hosts(settings)
    except ConfigError as exc:
        print(f"leaseworker chaos: error: {exc}", file=sys.stderr)
        return 2
    logging.getLogger("leaseworker.store").setLevel(logging.WARNING)  # its own store's migrations
    try:
        result = run_campaign(settings, lambda line: print(line, flush=True))
    except Interrupted as exc:  # everything it started is stopped already
        print(f"leaseworker chaos: {exc}", file=sys.stderr)
        return 130
    except Exception as exc:  # a service that did not start or come back: not a verdict
        cause = _innermost(exc)
        if isinstance(cause, ConfigError):  # the brokers refuse these credentials: permanent
            print(f"leaseworker chaos: error: {cause}", file=sys.stderr)
            return 2
        print(f"leaseworker chaos: error: {type(cause).__name__}: {cause}", file=sys.stderr)
        return 1
    print(render(result), flush=True)
    if args.report is not None:
        args.report.write_text(to_json(result) + "\n")
    if args.html is not None:
        args.html.write_text(to_html(result))
    if result.inconclusive is not None and all(v.passed for v in result.verdicts):
        print(f"leaseworker chaos: inconclusive: {result.inconclusive}", file=sys.stderr)
    return 0 if result.ok else 1


def _check_hosts(settings: Any) -> None:
    """Raise ``ConfigError`` saying why ``--hosts`` cannot run with these settings, or here."""
    if not settings.hosts:
        return
    from .._services import Hosts

    if settings.topology != "single":
        why: str | None = "the single topology only"
    elif settings.store_url or settings.bootstrap_servers:
        why = "its own services only, not with --store-url or --bootstrap-servers"
    else:
        why = Hosts.available()
    if why is not None:
        raise ConfigError(f"--hosts: {why}")


def _check_flags(settings: Any) -> None:
    """Raise ``ConfigError`` saying why these flags cannot go together."""
    if settings.kafka_brokers != 1 and settings.bootstrap_servers:
        raise ConfigError("--kafka-brokers is for local brokers, not with --bootstrap-servers")
    if settings.postgres_standby and (settings.store_url or settings.hosts):
        raise ConfigError(
            "--postgres-standby starts its own store, not with --store-url or --hosts"
        )
    if settings.kafka_security.protocol != "PLAINTEXT" and not settings.bootstrap_servers:
        raise ConfigError("the Kafka SASL/TLS flags need --bootstrap-servers")


def _innermost(exc: BaseException) -> BaseException:
    """Return the first leaf of nested exception groups (task groups wrap the real error)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
