"""``leaseworker trigger TOPIC --key K --payload JSON``: send one trigger to Kafka.

The payload comes from ``--payload`` (``-``: standard input) or
``--payload-file``, and is checked as the worker checks a record before it is
sent: a trigger the worker would dead-letter (not a JSON object, ``NaN``, a
key that cannot name a lease, too large) exits 2 with one line, and so do a
missing topic and a broker that does not answer; aiokafka's own log lines are
shown at ``--log-level DEBUG`` only.

With an OTLP endpoint (``--otlp-endpoint`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``)
the send is a PRODUCER span whose W3C ``traceparent`` travels in the record's
headers, so the worker's spans join its trace; the printed JSON then carries
its ``traceId``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import anyio

from .._errors import ConfigError, MalformedTrigger
from .._execution import Trigger, check_job_key, decode_trigger
from .._kafka import KafkaError, describe_kafka_error, refused_error, send_trigger
from .._telemetry import traced_send
from .._version import __version__
from ._common import config_default, env_default, env_name, positive_int, positive_seconds
from ._kafka_flags import (
    add_bootstrap_servers_flag,
    add_kafka_security_flags,
    kafka_security_from,
    mute_aiokafka_unless_debug,
)


def add_parser(subparsers: Any, summary: str) -> None:
    """Register the ``trigger`` subcommand."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "trigger",
        help=summary,
        description="Check one trigger as the worker would, produce it, and print where it "
        "landed as JSON. A trigger the worker would refuse, a missing topic or a broker "
        "that does not answer exits 2 with one line.",
    )
    parser.add_argument("--version", action="version", version=f"leaseworker {__version__}")
    parser.add_argument("topic", help="the job's topic")
    parser.add_argument("--key", default=None, help="record key; the default job key")
    given = parser.add_mutually_exclusive_group()
    given.add_argument(
        "--payload", default=None, help="a JSON object, or - to read it from stdin (default {})"
    )
    given.add_argument("--payload-file", metavar="PATH", help="read the JSON object from PATH")
    add_bootstrap_servers_flag(parser)
    parser.add_argument(
        "--max-payload-bytes",
        type=positive_int,
        default=env_default("--max-payload-bytes", config_default("max_payload_bytes")),
        help="larger payloads are refused, as the worker would dead-letter them "
        f"(env {env_name('--max-payload-bytes')}; default {config_default('max_payload_bytes')})",
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


def checked_trigger(
    topic: str, key: str | None, value: bytes, *, max_payload_bytes: int
) -> Trigger:
    """Decode ``value`` and check ``key`` as the worker would; raise MalformedTrigger if refused.

    The job key is checked when the trigger names one (``--key``, else the
    payload's ``jobId``); without either, the job class may still derive one.
    """
    trigger = decode_trigger(
        topic=topic,
        partition=0,
        offset=0,
        key=None if key is None else key.encode(),
        value=value,
        max_payload_bytes=max_payload_bytes,
    )
    named = key if key is not None else trigger.payload.get("jobId")
    if named is not None:
        check_job_key(named)
    return trigger


def _payload_bytes(args: argparse.Namespace) -> bytes:
    """Return the payload as given: ``--payload``, stdin (``-``) or ``--payload-file``."""
    if args.payload_file is not None:
        try:
            return Path(args.payload_file).read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read {args.payload_file}: {exc.strerror or exc}") from None
    if args.payload == "-":
        return sys.stdin.buffer.read()
    return ("{}" if args.payload is None else args.payload).encode()


def _trigger(args: argparse.Namespace) -> int:
    from .._telemetry import configure

    mute_aiokafka_unless_debug(args)
    try:
        security = kafka_security_from(args)
        value = _payload_bytes(args)
        trigger = checked_trigger(
            args.topic, args.key, value, max_payload_bytes=args.max_payload_bytes
        )
        telemetry = configure(
            pod="leaseworker-trigger", otlp_endpoint=args.otlp_endpoint, check_collector=True
        )
    except (ConfigError, MalformedTrigger) as exc:
        return _error(_refused(exc))
    landed: dict[str, Any] = {"topic": args.topic}

    async def main() -> None:
        with traced_send(args.topic, args.key, telemetry.tracer_provider) as outgoing:
            partition, offset = await send_trigger(
                args.bootstrap_servers,
                args.topic,
                key=args.key,
                payload=dict(trigger.payload),
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
    except ConfigError as exc:
        return _error(str(exc))
    except (KafkaError, OSError, TimeoutError) as exc:
        refused = refused_error(args.bootstrap_servers, exc, security)
        if refused is not None:  # an ACL the producer lacks: not a matter of time
            return _error(str(refused))
        return _error(
            f"Kafka at {args.bootstrap_servers} did not take the trigger within "
            f"{args.timeout:g}s ({describe_kafka_error(exc)})"
        )
    finally:
        telemetry.close()
    print(json.dumps(landed))
    return 0


def _refused(exc: ConfigError | MalformedTrigger) -> str:
    if isinstance(exc, MalformedTrigger):
        return f"the worker would refuse this trigger ({exc.reason}): {exc.detail}"
    return str(exc)


def _error(message: str) -> int:
    print(f"leaseworker trigger: error: {message}", file=sys.stderr)
    return 2
