"""The names telemetry speaks in: span names, attribute keys and metric names.

Kafka coordinates use the OpenTelemetry messaging semantic conventions as of
1.27 (``messaging.operation.name``/``type``, ``messaging.destination.partition.id``
as a string, ``messaging.kafka.offset`` as an int,
``messaging.consumer.group.name``); leaseworker's own attributes carry the
``leaseworker.`` prefix. These strings are a contract with dashboards and
alerts: docs/telemetry.md lists them, and tests pin them.
"""

from __future__ import annotations

from typing import Final

# -- messaging semantic conventions (1.27+) -------------------------------------------

MESSAGING_SYSTEM: Final = "messaging.system"
MESSAGING_OPERATION_NAME: Final = "messaging.operation.name"
MESSAGING_OPERATION_TYPE: Final = "messaging.operation.type"
MESSAGING_DESTINATION: Final = "messaging.destination.name"
MESSAGING_PARTITION: Final = "messaging.destination.partition.id"
MESSAGING_OFFSET: Final = "messaging.kafka.offset"
MESSAGING_KEY: Final = "messaging.kafka.message.key"
MESSAGING_GROUP: Final = "messaging.consumer.group.name"
MESSAGING_BODY_SIZE: Final = "messaging.message.body.size"
ERROR_TYPE: Final = "error.type"
SERVICE_INSTANCE_ID: Final = "service.instance.id"

# -- leaseworker's own ------------------------------------------------------------------

JOB_KEY: Final = "leaseworker.job.key"
EXECUTION_ID: Final = "leaseworker.execution.id"
POD: Final = "leaseworker.pod"
FENCE: Final = "leaseworker.fence"
OUTCOME: Final = "leaseworker.outcome"
BUSY_RETRIES: Final = "leaseworker.lease.busy_retries"
WAIT_MS: Final = "leaseworker.lease.wait_ms"
ROUND_TRIP_MS: Final = "leaseworker.lease.round_trip_ms"
REMAINING_MS: Final = "leaseworker.lease.remaining_ms"
RENEWAL_OUTCOME: Final = "leaseworker.renewal.outcome"
LOSS_REASON: Final = "leaseworker.loss.reason"
COMPLETION_STATUS: Final = "leaseworker.completion.status"
STOP_LATENCY_MS: Final = "leaseworker.stop_latency_ms"
CPU_SECONDS: Final = "leaseworker.process.cpu_seconds"
PEAK_MEMORY: Final = "leaseworker.process.peak_memory_bytes"
REASON: Final = "leaseworker.reason"
RELEASE_DELETED: Final = "leaseworker.release.deleted"
RETRY_IN_MS: Final = "leaseworker.retry_in_ms"
COMMIT_POSITION: Final = "leaseworker.commit.position"
DEAD_LETTER_REASON: Final = "leaseworker.dead_letter.reason"
MALFORMED_REASON: Final = "leaseworker.malformed.reason"
PREVIOUS_EXECUTION_ID: Final = "leaseworker.previous.execution.id"
EFFECT_ID: Final = "leaseworker.effect.id"
EFFECT_STATUS: Final = "leaseworker.effect.status"
RECEIVER: Final = "leaseworker.receiver"
RELAY: Final = "leaseworker.relay"
NAMESPACE: Final = "leaseworker.namespace"

# -- span names -------------------------------------------------------------------------

SPAN_RECEIVED: Final = "trigger received"
SPAN_ACQUIRE: Final = "lease acquire"
SPAN_RUN: Final = "job run"
SPAN_RENEW: Final = "lease renew"
SPAN_LOST: Final = "ownership lost"
SPAN_CANCEL: Final = "cancel requested"
SPAN_STOPPED: Final = "job stopped"
SPAN_RELEASE: Final = "lease release"
SPAN_DEAD_LETTER: Final = "dead letter"


def process_span_name(topic: str) -> str:
    """Return the CONSUMER span's name, ``process {topic}`` (semantic conventions)."""
    return f"process {topic}"


def commit_span_name(topic: str) -> str:
    """Return the offset commit span's name, ``commit {topic}``."""
    return f"commit {topic}"


def send_span_name(topic: str) -> str:
    """Return the PRODUCER span of ``leaseworker trigger`` and of the relay, ``send {topic}``."""
    return f"send {topic}"


def publish_span_name(topic: str) -> str:
    """Return the span of a job's ``publish()`` (the message is created), ``publish {topic}``."""
    return f"publish {topic}"


# -- metric names (OpenTelemetry; Prometheus adds unit suffixes, e.g. ``_seconds``) ------

METRIC_DURATION: Final = "leaseworker.execution.duration"
METRIC_OUTCOMES: Final = "leaseworker.execution.outcomes"
METRIC_IN_FLIGHT: Final = "leaseworker.execution.in_flight"
METRIC_OVERLAP: Final = "leaseworker.execution.overlap"
METRIC_CPU: Final = "leaseworker.execution.cpu"
METRIC_RENEWAL: Final = "leaseworker.lease.renewal.duration"
METRIC_LOSSES: Final = "leaseworker.lease.losses"
METRIC_STOP_LATENCY: Final = "leaseworker.lease.stop_latency"
METRIC_RECEIVED: Final = "leaseworker.triggers.received"
METRIC_COMMITTED: Final = "leaseworker.triggers.committed"
METRIC_DEAD_LETTERS: Final = "leaseworker.dead_letters"
METRIC_COMPLETIONS: Final = "leaseworker.completions"
METRIC_LOST_REPEATEDLY: Final = "leaseworker.triggers.lost_repeatedly"
METRIC_OUTBOX_DEPTH: Final = "leaseworker.outbox.depth"
METRIC_OUTBOX_AGE: Final = "leaseworker.outbox.oldest_age"
METRIC_EFFECTS_SENT: Final = "leaseworker.effects.sent"
METRIC_SEND_FAILURES: Final = "leaseworker.effects.send_failures"
METRIC_EFFECTS_RECEIVED: Final = "leaseworker.effects.received"
