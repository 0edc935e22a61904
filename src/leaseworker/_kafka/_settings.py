"""``SourceSettings``: the settings the Kafka source reads, as a protocol.

The pod's :class:`~leaseworker.PodConfig` provides them; the source depends
on this narrow view instead of the pod's config, so the Kafka layer imports
nothing of the pod that composes it.
"""

from __future__ import annotations

from typing import Protocol

from ._security import KafkaSecurity


class SourceSettings(Protocol):
    """What a :class:`KafkaTriggerSource` needs to know (all durations in seconds)."""

    @property
    def bootstrap_servers(self) -> str:
        """Kafka bootstrap servers, ``host:port[,...]``."""

    @property
    def group(self) -> str:
        """The consumer group id."""

    @property
    def pod(self) -> str:
        """The pod's name, in client ids and log records."""

    @property
    def kafka_security(self) -> KafkaSecurity:
        """SASL/TLS settings for every Kafka client."""

    @property
    def concurrency(self) -> int:
        """Executions running at once; also the poll's record bound."""

    @property
    def dead_letter_topic(self) -> str | None:
        """Where malformed and failed triggers go, or ``None`` to only log them."""

    @property
    def max_payload_bytes(self) -> int:
        """The largest record value the source decodes."""

    @property
    def auto_offset_reset(self) -> str:
        """Where a group with no committed offset starts: ``earliest`` or ``latest``."""

    @property
    def shutdown_timeout(self) -> float:
        """How long in-flight executions may finish after a stop."""

    @property
    def session_timeout(self) -> float:
        """How long the group waits for a silent member."""

    @property
    def heartbeat(self) -> float:
        """The heartbeat interval."""

    @property
    def max_poll_interval(self) -> float:
        """How long one poll-loop turn may take."""

    @property
    def revoke_timeout(self) -> float:
        """How long revoked partitions' executions may keep running."""

    @property
    def rebalance_timeout(self) -> float:
        """How long the group waits for this member's revoke callback."""

    @property
    def poll_timeout(self) -> float:
        """How long one poll waits for records."""

    @property
    def commit_timeout(self) -> float:
        """The bound of one offset commit, retries included."""

    @property
    def kafka_timeout(self) -> float:
        """The bound of every other Kafka request."""

    @property
    def redis_timeout(self) -> float:
        """The bound of one Redis call (a revoked execution's release)."""

    @property
    def startup_retry_cap(self) -> float:
        """The longest wait between start-up retries."""
