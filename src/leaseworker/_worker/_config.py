"""``WorkerConfig``: every setting of a worker pod, checked when it is built.

Plain keyword-only frozen dataclass; the CLI maps flags and ``LEASEWORKER_*``
environment variables onto it. Settings that could not keep leaseworker's
guarantees raise :class:`~leaseworker.ConfigError` at construction, not at
the first trigger.
"""

from __future__ import annotations

import math
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from redis.connection import parse_url

from .._errors import ConfigError
from .._execution import DEFAULT_MAX_PAYLOAD_BYTES
from .._kafka import KafkaSecurity
from .._store import DEFAULT_URL, parse_store_url, redact


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerConfig:
    """How a worker pod connects, how much it runs at once and how it stops.

    ::

        config = WorkerConfig(bootstrap_servers="kafka:9092", redis_url="redis://redis:6379/0",
                              group="reports", concurrency=8, shutdown_timeout=60,
                              dead_letter_topic="reports.dead-letter")

    Kafka timing: ``session_timeout`` is how long the group waits for a silent
    (crashed) member before rebalancing; ``heartbeat_interval`` defaults to a
    fifth of it. ``max_poll_interval`` only needs to cover one poll-loop turn,
    because the loop keeps polling while jobs run. ``revoke_timeout`` bounds
    how long in-flight executions of revoked partitions may keep running in a
    rebalance before they are cancelled; the group's rebalance timeout is sized
    from it (:attr:`rebalance_timeout`). Every Kafka request is bounded by
    ``kafka_timeout``, every commit by ``commit_timeout``, every Redis command
    by ``redis_timeout``. ``kafka_security`` (SASL/TLS) goes to every Kafka
    client; ``redis_url`` carries Redis AUTH/TLS (``rediss://user:pw@host``) and
    is left out of the repr. ``store_url`` selects the fenced completion store
    (``postgresql://...`` or ``sqlite:///path``; default: the embedded SQLite
    file ``leaseworker-completions.sqlite3`` in the working directory), every
    store call bounded by ``store_timeout``; it is left out of the repr too.
    ``log_job_errors`` makes the default logging observer log a failed job's
    exception message and traceback, which it otherwise leaves out (they may
    quote payload data). ``lease_pipelining`` (default on) lets lease calls made
    while another is in flight go to Redis together, as one pipeline; a call can
    then wait for the one in flight, so ``redis_timeout`` should be at least six
    round trips (``False`` sends every call on its own; see docs/operations.md).
    """

    bootstrap_servers: str = "127.0.0.1:9092"
    redis_url: str = field(default="redis://127.0.0.1:6379/0", repr=False)  # may hold a password
    group: str = "leaseworker"
    pod: str = field(default_factory=socket.gethostname)
    namespace: str = "leaseworker"
    concurrency: int = 4
    shutdown_timeout: float = 30.0
    dead_letter_topic: str | None = None
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    session_timeout: float = 10.0
    heartbeat_interval: float | None = None
    max_poll_interval: float = 60.0
    revoke_timeout: float = 5.0
    poll_timeout: float = 0.2
    commit_timeout: float = 5.0
    kafka_timeout: float = 30.0
    redis_timeout: float = 0.5
    store_url: str = field(default=DEFAULT_URL, repr=False)  # may hold a password
    store_timeout: float = 5.0
    startup_retry_cap: float = 10.0
    kafka_security: KafkaSecurity = field(default_factory=KafkaSecurity)
    log_job_errors: bool = False
    lease_pipelining: bool = True

    def __post_init__(self) -> None:
        _require(bool(self.bootstrap_servers.strip()), "bootstrap_servers must not be empty")
        _require(
            urlsplit(self.redis_url).scheme in _REDIS_SCHEMES,
            "redis_url must be redis://, rediss:// or unix://",
        )
        try:
            parse_url(self.redis_url)  # type: ignore[no-untyped-call]  # what from_url refuses
        except ValueError:
            # Not redis-py's message: it may quote the URL, password included.
            raise ConfigError(
                "redis_url is not a valid Redis URL (check its port and database)"
            ) from None
        parse_store_url(self.store_url)  # ConfigError for a malformed URL, before any I/O
        _require(bool(self.group), "group must not be empty")
        _require(bool(self.pod) and self.pod.isprintable(), "pod must be a printable name")
        _require(self.concurrency >= 1, f"concurrency must be >= 1, got {self.concurrency}")
        _require(self.max_payload_bytes >= 1, "max_payload_bytes must be >= 1")
        _require(self.dead_letter_topic != "", "dead_letter_topic must be None or a topic name")
        for name in (
            "shutdown_timeout",
            "session_timeout",
            "max_poll_interval",
            "revoke_timeout",
            "poll_timeout",
            "commit_timeout",
            "kafka_timeout",
            "redis_timeout",
            "store_timeout",
            "startup_retry_cap",
        ):
            value = getattr(self, name)
            _require(
                value > 0 and math.isfinite(value),
                f"{name} must be a finite number of seconds > 0, got {value}",
            )
        heartbeat = self.heartbeat
        _require(
            heartbeat > 0 and math.isfinite(heartbeat),
            f"heartbeat_interval must be a finite number of seconds > 0, got {heartbeat}",
        )
        _require(
            heartbeat < self.session_timeout,
            f"heartbeat_interval={heartbeat}s must be "
            f"shorter than session_timeout={self.session_timeout}s",
        )
        _require(
            self.poll_timeout < self.max_poll_interval / 2,
            "poll_timeout must be well "
            f"under max_poll_interval={self.max_poll_interval}s, or the pod leaves the group",
        )
        _require(
            self.kafka_timeout > self.rebalance_timeout,
            f"kafka_timeout={self.kafka_timeout}"
            f"s must exceed the rebalance timeout ({self.rebalance_timeout:.1f}s): a JoinGroup "
            "request waits that long",
        )

    @property
    def heartbeat(self) -> float:
        """The heartbeat interval in seconds (``session_timeout / 5`` unless set)."""
        if self.heartbeat_interval is None:
            return self.session_timeout / 5
        return self.heartbeat_interval

    @property
    def rebalance_timeout(self) -> float:
        """How long the group waits for this pod to finish its revoke callback, in seconds.

        The callback lets executions finish for ``revoke_timeout``, cancels the
        rest and waits for their shielded lease releases (one Redis timeout
        each, in parallel), then commits: the sum, plus one second of slack.
        """
        return self.revoke_timeout + 2 * self.redis_timeout + self.commit_timeout + 1.0

    def redacted_redis(self) -> str:
        """``host:port`` of the Redis URL, for log lines (never the password)."""
        return _redact(self.redis_url)

    def redacted_store(self) -> str:
        """Return the store URL with any password replaced by ``***``, for log lines."""
        return redact(self.store_url)


_REDIS_SCHEMES = {"redis", "rediss", "unix"}


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix:{parts.path}"
    return f"{parts.hostname or '?'}:{parts.port or 6379}"
