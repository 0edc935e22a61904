"""``leaseworker demo [stack|incident|failover]``: the demos behind one subcommand.

``stack`` (the default, and the README's main command) runs worker pods on a
local Redis and Kafka and proves, under a Redis stall, that no report ever
ran twice at once (:mod:`leaseworker_dev._demos._stack_demo`). ``incident`` replays the
original lease-expiry incident with a naive lock and with ``hold()`` against
a private Redis, then with a CPU-bound job in the event loop and through
``run_in_process`` (:mod:`leaseworker_dev._demos._incident`). ``failover`` replays a
Sentinel failover that loses the lease, without and with replica
acknowledgement (:mod:`leaseworker_dev._demos._failover`). Each exits 1 when its
proof fails.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from leaseworker.toolkit import positive_seconds


def add_parser(subparsers: Any, summary: str) -> None:
    """Register the ``demo`` subcommand."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help=summary,
        description="stack: three worker pods on a private Redis and Kafka, a Redis stall, "
        "and a summary proving no overlap (about 25 s). incident: a naive lock vs hold() "
        "on one timeline, then a CPU loop that never awaits in the event loop vs through "
        "held.run_in_process. failover: a Sentinel failover that loses the lease, with "
        "--lease-replicas 0 and 1 (about 30 s). services: the local Redis, Kafka and "
        "Jaeger alone (--postgres: a PostgreSQL too, --postgres-standby: with a standby, "
        "--kafka-brokers 3: three brokers), for a job of your own. Ctrl-C, "
        "SIGTERM and SIGHUP stop everything a demo started and remove its temporary "
        "directories.",
    )
    parser.add_argument(
        "scenario",
        nargs="?",
        choices=("stack", "incident", "failover", "services"),
        default="stack",
        help="which demo to run (default: stack); services: only start the local Redis, "
        "Kafka and Jaeger (and with --postgres a PostgreSQL) and keep them up until Ctrl-C",
    )
    parser.add_argument(
        "--lease-duration",
        type=positive_seconds,
        default=None,
        help="incident only: lease duration in seconds (default 1.0)",
    )
    parser.add_argument("--ttl", type=positive_seconds, help=argparse.SUPPRESS)  # deprecated
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="services only: also start a local PostgreSQL and print its URL, a store for "
        "--store-url (off by default: the pods' default store is SQLite)",
    )
    parser.add_argument(
        "--postgres-standby",
        choices=("sync", "async"),
        default=None,
        help="services only: the PostgreSQL is a primary with a streaming standby whose "
        "commits wait for it (sync) or not (async); its URL names both nodes "
        "(target_session_attrs=read-write), implies --postgres",
    )
    parser.add_argument(
        "--kafka-brokers",
        type=int,
        choices=(1, 3),
        default=1,
        help="services only: 3 starts three KRaft brokers (replication factor 3, "
        "min.insync.replicas 2) instead of one",
    )
    parser.add_argument(
        "--keep-running",
        action="store_true",
        help="stack only: keep Redis, Kafka and Jaeger up after the summary until Ctrl-C",
    )
    parser.add_argument(
        "--html",
        type=Path,
        default=None,
        help="stack only: where to write the stalled report's timeline page "
        "(default: leaseworker-demo-timeline.html in the temp directory)",
    )
    parser.set_defaults(handler=_main)


MIN_INCIDENT_LEASE = 0.25
"""Shortest ``--lease-duration`` the incident replay runs with: its leases renew every third or
quarter of it with a command timeout of a fifth, and both must fit inside it with margin."""


def _main(args: argparse.Namespace) -> int:
    from .._services import ToolMissingError

    try:
        with _stop_signals_interrupt():
            return _scenario(args)
    except ToolMissingError as exc:  # a tool to install: one line, no traceback
        print(f"leaseworker demo: error: {exc}", file=sys.stderr)
        return 2


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""Signals that stop a demo as Ctrl-C (SIGINT) does."""


@contextlib.contextmanager
def _stop_signals_interrupt() -> Iterator[None]:
    """Make SIGTERM and SIGHUP act as Ctrl-C for the duration; restore the handlers after.

    Their default action ends the process at once, leaving the services (own
    sessions, so they outlive it) and the work directories behind. Here the
    first one runs the current SIGINT handler instead: inside ``anyio.run``
    that cancels the main task (the pods are stopped on the way out), elsewhere
    it raises ``KeyboardInterrupt`` and the ``finally`` blocks stop the
    services. Later ones are ignored, so a second SIGTERM cannot cut the
    cleanup short (every stop is bounded: SIGKILL follows its timeout). A
    SIGINT that was ignored at start (a background job of a shell script)
    interrupts too, for the duration: a demo must stop on all three.
    """
    interrupted = False

    def interrupt(signum: int, frame: FrameType | None) -> None:
        nonlocal interrupted
        if interrupted:
            return
        interrupted = True
        on_sigint = signal.getsignal(signal.SIGINT)
        if not callable(on_sigint):  # SIG_DFL: the process would just end
            raise KeyboardInterrupt
        on_sigint(signal.SIGINT, frame)

    previous = {signum: signal.signal(signum, interrupt) for signum in STOP_SIGNALS}
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _scenario(args: argparse.Namespace) -> int:
    given = {
        "--postgres": args.postgres,
        "--postgres-standby": args.postgres_standby is not None,
        "--kafka-brokers": args.kafka_brokers != 1,
    }
    for name, used in given.items():
        if used and args.scenario != "services":
            print(f"leaseworker demo: error: {name} is for `demo services` only", file=sys.stderr)
            return 2
    if args.scenario == "services":
        from .._demos import services_demo

        out = functools.partial(print, flush=True)
        services_demo(
            out,
            postgres=args.postgres,
            standby=args.postgres_standby,
            kafka_brokers=args.kafka_brokers,
        )
        return 0
    if args.scenario == "failover":
        from .._demos import failover_demo

        return failover_demo()
    if args.scenario == "incident":
        if args.ttl is not None:
            print("leaseworker demo: --ttl is deprecated; use --lease-duration", file=sys.stderr)
        lease_duration = args.lease_duration or args.ttl or 1.0
        if lease_duration < MIN_INCIDENT_LEASE:
            print(
                f"leaseworker demo: error: --lease-duration must be at least {MIN_INCIDENT_LEASE}s "
                "(a renewal and its timeout must fit inside the lease)",
                file=sys.stderr,
            )
            return 2
        from .._demos import incident_demo

        return incident_demo(lease_duration)
    from .._demos import DEFAULT_HTML, stack_demo

    summary = stack_demo(
        lambda line: print(line, flush=True),
        keep_running=args.keep_running,
        html=args.html or DEFAULT_HTML,
    )
    if not args.keep_running:
        print(summary.render(), flush=True)
    if not summary.ok:
        print("leaseworker demo: the run did not prove its claims (see above)", file=sys.stderr)
    return 0 if summary.ok else 1
