"""``leaseworker topics create NAME...``: create a job's topics without Kafka's shell tools.

Meant for trying a job against ``leaseworker demo --keep-running`` (or any
broker where topics are created by hand); it waits until every partition has
a leader, so ``run`` and ``trigger`` work right after. A refusal (the topic
exists, too many replicas for the brokers) or an unreachable broker is one
line on stderr and exit 2: retrying the same command cannot fix either.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import anyio

from .._errors import ConfigError
from .._kafka import KafkaError, create_topics, describe_kafka_error
from ._common import action_parser, fail, positive_int, positive_seconds
from ._kafka_flags import (
    add_bootstrap_servers_flag,
    add_kafka_security_flags,
    kafka_security_from,
    mute_aiokafka_unless_debug,
)


def add_parser(subparsers: Any, summary: str) -> None:
    """Register the ``topics`` subcommand (with its one action, ``create``)."""
    create = action_parser(
        subparsers,
        "topics",
        summary,
        "Manage Kafka topics.",
        (
            "create",
            "create topics and wait until every partition has a leader",
            "Create topics and wait until every partition has a leader; print them as JSON. "
            "Exit 2 with one line when the broker refuses or cannot be reached.",
        ),
    )
    create.add_argument("names", nargs="+", metavar="NAME", help="topic name(s)")
    create.add_argument(
        "--partitions", type=positive_int, default=1, help="partitions per topic (default 1)"
    )
    create.add_argument(
        "--replication-factor",
        type=positive_int,
        default=None,
        help="replicas per partition (default: the number of brokers, at most 3)",
    )
    create.add_argument(
        "--if-not-exists", action="store_true", help="a topic that exists already is no error"
    )
    add_bootstrap_servers_flag(create)
    create.add_argument(
        "--timeout",
        type=positive_seconds,
        default=30.0,
        help="seconds to wait for the broker (default 30)",
    )
    add_kafka_security_flags(create)
    create.set_defaults(handler=_create)


def _create(args: argparse.Namespace) -> int:
    mute_aiokafka_unless_debug(args)  # first: loading the CA file logs at INFO
    try:
        security = kafka_security_from(args)
    except ConfigError as exc:
        return _fail(str(exc))
    try:
        anyio.run(
            lambda: create_topics(
                args.bootstrap_servers,
                args.names,
                partitions=args.partitions,
                replication_factor=args.replication_factor,
                exist_ok=args.if_not_exists,
                within=args.timeout,
                security=security,
            )
        )
    except ConfigError as exc:  # the brokers refuse these credentials or certificates
        return _fail(str(exc))
    except TimeoutError:
        return _fail(f"no answer from Kafka at {args.bootstrap_servers} within {args.timeout:g}s")
    except (KafkaError, OSError) as exc:
        return _fail(describe_kafka_error(exc))
    print(json.dumps({"created": args.names, "partitions": args.partitions}))
    return 0


def _fail(reason: str) -> int:
    return fail("topics create", reason)
