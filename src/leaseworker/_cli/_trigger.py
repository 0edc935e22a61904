"""``leaseworker trigger TOPIC --key K --payload JSON``: send one trigger to Kafka.

With an OTLP endpoint (``--otlp-endpoint`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``)
the send is a PRODUCER span whose W3C ``traceparent`` travels in the record's
headers, so the worker's spans join its trace; the printed JSON then carries
its ``traceId``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import anyio

from .._errors import ConfigError
from .._kafka import KafkaError, send_trigger
from .._telemetry import traced_send
from .._version import __version__
from ._common import config_default, env_default, env_name, positive_seconds
from ._kafka_flags import add_kafka_security_flags, kafka_security_from


def add_parser(subparsers: Any) -> None:
    """Register the ``trigger`` subcommand."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "trigger",
        help="send one trigger (a JSON object) to a topic",
        description="Produce one trigger record and print where it landed as JSON.",
    )
    parser.add_argument("--version", action="version", version=f"leaseworker {__version__}")
    parser.add_argument("topic", help="the job's topic")
    parser.add_argument("--key", default=None, help="record key; the default job key")
    parser.add_argument(
        "--payload", type=_json_object, default={}, help="a JSON object (default {})"
    )
    parser.add_argument(
        "--bootstrap-servers",
        default=env_default("--bootstrap-servers", config_default("bootstrap_servers")),
        help=f"Kafka bootstrap servers (env {env_name('--bootstrap-servers')})",
    )
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=30.0,
        help="seconds to wait for the broker (default 30)",
    )
    parser.add_argument(
        "--otlp-endpoint",
        default=None,
        help="OTLP/HTTP endpoint for the send span (default $OTEL_EXPORTER_OTLP_ENDPOINT; none)",
    )
    add_kafka_security_flags(parser)
    parser.set_defaults(handler=_trigger)


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc.args[0]}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("payload must be a JSON object")
    return value


def _trigger(args: argparse.Namespace) -> int:
    from .._telemetry import configure

    telemetry = configure(pod="leaseworker-trigger", otlp_endpoint=args.otlp_endpoint)
    landed: dict[str, Any] = {"topic": args.topic}
    try:
        security = kafka_security_from(args)
    except ConfigError as exc:
        print(f"leaseworker trigger: error: {exc}", file=sys.stderr)
        return 2

    async def main() -> None:
        with traced_send(args.topic, args.key, telemetry.tracer_provider) as outgoing:
            partition, offset = await send_trigger(
                args.bootstrap_servers,
                args.topic,
                key=args.key,
                payload=args.payload,
                within=args.timeout,
                headers=outgoing.headers,
                security=security,
            )
            outgoing.sent(partition, offset)
        landed.update(partition=partition, offset=offset)
        if outgoing.trace_id:
            landed["traceId"] = outgoing.trace_id

    try:
        anyio.run(main)
    except (KafkaError, OSError, TimeoutError) as exc:
        print(f"leaseworker trigger: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        telemetry.close()
    print(json.dumps(landed))
    return 0
