"""``PodConfig``: every setting of a worker pod, checked when it is built.

Plain keyword-only frozen dataclass, one documented field per setting, with
read-only views by concern (``KafkaSettings``, ``GroupTiming``, ``Timeouts``,
``LeaseSettings``, ``StoreSettings``); the CLI maps flags and ``LEASEWORKER_*``
environment variables onto it. Settings that could not keep leaseworker's
guarantees raise :class:`~leaseworker.ConfigError` at construction, not at
the first trigger.
"""

from __future__ import annotations

import dataclasses
import math
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from .._effects import CLAIM_HOLD, RETENTION
from .._errors import ConfigError
from .._execution import DEFAULT_MAX_PAYLOAD_BYTES
from .._kafka import SEND_TIMEOUT, KafkaSecurity
from .._lease import parse_redis_url
from .._secrets import SecretFile
from .._store import DEFAULT_URL, STORE_CONNECTIONS, parse_store_url, redact

_DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


@dataclass(frozen=True, slots=True, kw_only=True)
class PodConfig:
    """How a worker pod connects, how much it runs at once and how it stops.

    ::

        config = PodConfig(bootstrap_servers="kafka:9092", redis_url="redis://redis:6379/0",
                              group="reports", concurrency=8, shutdown_timeout=60,
                              dead_letter_topic="reports.dead-letter")

    Every setting is a keyword with a default, documented where it is declared
    below; durations are in seconds. The flat fields are the one place each
    setting is kept (the constructor, the repr, ``dataclasses.replace`` and the
    ``run`` flags all use them). The same settings can also be read by concern,
    as small frozen views whose fields have the same names:

    - :attr:`kafka`: bootstrap servers, group, SASL/TLS, dead letters, payload bound,
      where a new group starts.
    - :attr:`group_timing`: session, heartbeat, poll and rebalance timing.
    - :attr:`timeouts`: the bound of every call and wait.
    - :attr:`leases`: the lease Redis, key namespace, timeout and pipelining.
    - :attr:`store`: the completion store's URL and timeout, the outbox's retention and claims.
    """

    # -- connections: where the pod's Kafka and Redis are, and who it is

    bootstrap_servers: str = "127.0.0.1:9092"
    """Kafka bootstrap servers, ``host:port[,...]``."""

    redis_url: str = field(default=_DEFAULT_REDIS_URL, repr=False)
    """The lease Redis, any topology (see :func:`~leaseworker.redis_from_url`).

    ``redis://``, ``rediss://`` (TLS), ``unix://``,
    ``redis+sentinel://host:port[,host:port...]/<service>[/db]`` or
    ``redis+cluster://host:port[,host:port...]`` (``rediss+...`` for TLS). It
    carries Redis AUTH (``rediss://user:pw@host``), so it is left out of the repr.
    """

    redis_url_file: Path | None = None
    """A file holding :attr:`redis_url` (a mounted Secret), read again on every reconnect.

    Read at construction unless ``redis_url`` is given too (the CLI passes the
    URL it read, with ``--redis-ca-file``, ``-cert-file`` and ``-key-file``
    added). The topology, hosts and TLS options are the first URL's; a new
    user or password in the file is used by the next connection made.
    """

    group: str = "leaseworker"
    """The Kafka consumer group id; the pods of one job share it."""

    pod: str = field(default_factory=socket.gethostname)
    """This pod's name in logs, spans and lease owners (default: the host name)."""

    namespace: str = "leaseworker"
    """Prefix of the lease and fence keys in Redis and of the job keys in the store."""

    # -- capacity and stopping

    concurrency: int = 4
    """Executions running at once in this pod (also the most records one poll returns)."""

    shutdown_timeout: float = 30.0
    """How long in-flight executions may finish after a stop before they are cancelled."""

    dead_letter_topic: str | None = None
    """Where malformed, failed and timed-out triggers go; ``None``: log and skip them."""

    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    """Larger trigger payloads are dead-lettered as ``too_large``, not decoded."""

    # -- Kafka group timing: how the pod stays a member of its consumer group

    session_timeout: float = 10.0
    """How long the group waits for a silent (crashed) member before rebalancing."""

    heartbeat_interval: float | None = None
    """Time between group heartbeats; ``None``: ``session_timeout / 5`` (:attr:`heartbeat`)."""

    max_poll_interval: float = 60.0
    """How long one poll-loop turn may take before the group evicts the pod.

    It only needs to cover one turn, because the loop keeps polling while jobs run.
    """

    revoke_timeout: float = 5.0
    """How long revoked partitions' in-flight executions may run on in a rebalance.

    Then they are cancelled; the group's rebalance timeout is sized from it
    (:attr:`rebalance_timeout`).
    """

    poll_timeout: float = 0.2
    """How long one poll waits for records (well under ``max_poll_interval``)."""

    # -- call bounds: every Kafka and Redis call ends in time

    commit_timeout: float = 5.0
    """The bound of one offset commit, its retries included."""

    kafka_timeout: float = 30.0
    """The bound of every other Kafka request; above :attr:`rebalance_timeout` (JoinGroup)."""

    redis_timeout: float = 0.5
    """The bound of every Redis command (with ``lease_pipelining``: six round trips or more)."""

    # -- the completion store

    store_url: str = field(default=DEFAULT_URL, repr=False)
    """The fenced completion store: ``postgresql://...`` or ``sqlite:///path``.

    The default is the embedded SQLite file ``leaseworker-completions.sqlite3``
    in the working directory (one per host: pods share a PostgreSQL database).
    It may hold a password, so it is left out of the repr.
    """

    store_url_file: Path | None = None
    """A file holding :attr:`store_url`, read again whenever the store opens a connection.

    Read at construction unless ``store_url`` is given too.
    """

    store_timeout: float = 5.0
    """The bound of every completion store call."""

    outbox_retention: float = RETENTION
    """Seconds a sent outbox message is kept (``leaseworker inspect`` shows it) before deletion."""

    outbox_claim_timeout: float = CLAIM_HOLD
    """How long a relay's claim on unsent messages lasts, in seconds.

    A dead pod's claimed messages wait this long before another pod's relay
    sends them; it must exceed :attr:`outbox_send_bound`, or a claim lapses
    while its round still sends and another relay sends the rows again.
    """

    outbox_relay_connections: int | None = None
    """How many of the pod's pooled PostgreSQL connections its relay may hold at once.

    The rest stay the jobs' while a backlog drains. ``None``: two fifths
    of the pool, 4 of its 10; at most 10. Other stores ignore it.
    """

    # -- start-up, Kafka security and behaviour

    startup_retry_cap: float = 10.0
    """The longest wait between retries while Redis, Kafka or the store cannot be reached."""

    kafka_security: KafkaSecurity = field(default_factory=KafkaSecurity)
    """SASL/TLS settings, given to every Kafka client."""

    log_job_errors: bool = False
    """Whether the default logging observer logs a failed job's exception and traceback.

    Off by default: they may quote payload data.
    """

    lease_pipelining: bool = True
    """Whether lease calls made while another is in flight go to Redis as one pipeline.

    A call can then wait for the one in flight, so ``redis_timeout`` should be
    at least six round trips; ``False`` sends every call on its own (see
    docs/operations.md).
    """

    lease_replicas: int | None = None
    """Replicas that must acknowledge every lease acquire and renewal (``WAIT``).

    ``None``: 1 on Sentinel and Cluster URLs, 0 on a single node. 0 turns the
    wait off on replicated Redis, at the price docs/operations.md measures.
    """

    loss_budget: int | None = None
    """Executions of one trigger that may lose their lease in a row before it is dead-lettered.

    ``None``: the job class's ``loss_budget`` (5 unless the class says otherwise).
    """

    max_result_bytes: int | None = None
    """The largest job result (compact JSON) stored; larger ones are dead-lettered ``bad_result``.

    ``None``: the job class's ``max_result_bytes`` (1 MiB unless the class says otherwise).
    """

    process_workers: int | None = None
    """Child processes ``ctx.run_in_process`` runs calls in, started with the pod.

    ``None``: the machine's cores. Each imports the job's module once, at start.
    0: none (a job that calls ``run_in_process`` then fails with ``ConfigError``).
    """

    max_tasks_per_child: int | None = None
    """Calls a process worker runs before it is replaced (``None``: no limit)."""

    max_memory_per_child: int | None = None
    """Peak RSS (bytes) above which a process worker is replaced after its call (``None``: none)."""

    auto_offset_reset: str = "earliest"
    """Where a consumer group with no committed offset starts reading.

    ``earliest``: every trigger still on the topic (a new group replays it);
    ``latest``: only triggers sent after the group first joined.
    """

    def __post_init__(self) -> None:
        for name, default in (("redis_url", _DEFAULT_REDIS_URL), ("store_url", DEFAULT_URL)):
            source = getattr(self, f"{name}_file")
            if source is not None and getattr(self, name) == default:  # the URL from the file
                object.__setattr__(self, name, SecretFile(Path(source), f"{name}_file").read())
        _require(bool(self.bootstrap_servers.strip()), "bootstrap_servers must not be empty")
        parse_redis_url(self.redis_url)  # ConfigError for a malformed URL, before any I/O
        _require(
            self.lease_replicas is None or self.lease_replicas >= 0,
            f"lease_replicas must be >= 0, got {self.lease_replicas}",
        )
        parse_store_url(self.store_url)  # ConfigError for a malformed URL, before any I/O
        _require(bool(self.group), "group must not be empty")
        _require(bool(self.pod) and self.pod.isprintable(), "pod must be a printable name")
        _require(self.concurrency >= 1, f"concurrency must be >= 1, got {self.concurrency}")
        _require(self.max_payload_bytes >= 1, "max_payload_bytes must be >= 1")
        _require(
            self.process_workers is None or self.process_workers >= 0,
            f"process_workers must be None or >= 0, got {self.process_workers}",
        )
        for name in (
            "loss_budget",
            "max_result_bytes",
            "max_tasks_per_child",
            "max_memory_per_child",
        ):
            value = getattr(self, name)
            _require(value is None or value >= 1, f"{name} must be None or >= 1, got {value}")
        _require(self.dead_letter_topic != "", "dead_letter_topic must be None or a topic name")
        relay_connections = self.outbox_relay_connections
        _require(
            relay_connections is None or 1 <= relay_connections <= STORE_CONNECTIONS,
            f"outbox_relay_connections must be None or between 1 and {STORE_CONNECTIONS}"
            f" (the pod's store connections), got {relay_connections}",
        )
        _require(
            self.auto_offset_reset in ("earliest", "latest"),
            f"auto_offset_reset must be earliest or latest, got {self.auto_offset_reset!r}",
        )
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
            "outbox_retention",
            "outbox_claim_timeout",
        ):
            value = getattr(self, name)
            _require(
                value > 0 and math.isfinite(value),
                f"{name} must be a finite number of seconds > 0, got {value}",
            )
        _require(
            self.outbox_claim_timeout > self.outbox_send_bound,
            f"outbox_claim_timeout={self.outbox_claim_timeout}s must exceed the relay's send bound"
            f" ({self.outbox_send_bound:.1f}s: producer start and one wave, {SEND_TIMEOUT:.0f}s"
            f" each, plus store_timeout), or a claim lapses mid-send and its rows are sent again",
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
    def outbox_send_bound(self) -> float:
        """The longest a relay round's first wave takes, in seconds: its claim must outlast it.

        The producer's start and the wave's sends (``SEND_TIMEOUT``, 10 s,
        each), then the mark (``store_timeout``). A key's later rows go in
        later waves, each as long again only while the broker is slow to
        acknowledge: the claim's margin is theirs.
        """
        return 2 * SEND_TIMEOUT + self.store_timeout

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

    @property
    def kafka(self) -> KafkaSettings:
        """Where and as which consumer group the pod consumes, and where dead letters go."""
        return _view(self, KafkaSettings)

    @property
    def group_timing(self) -> GroupTiming:
        """How the pod stays a member of its consumer group."""
        return _view(self, GroupTiming)

    @property
    def timeouts(self) -> Timeouts:
        """The bound of every call and wait."""
        return _view(self, Timeouts)

    @property
    def leases(self) -> LeaseSettings:
        """The lease Redis and how lease calls reach it."""
        return _view(self, LeaseSettings)

    @property
    def store(self) -> StoreSettings:
        """The fenced completion store."""
        return _view(self, StoreSettings)

    @property
    def replicas(self) -> int:
        """The replicas a lease waits for: ``lease_replicas``, or the URL's default."""
        if self.lease_replicas is not None:
            return self.lease_replicas
        return parse_redis_url(self.redis_url).default_replicas

    def redacted_redis(self) -> str:
        """Where the lease Redis is, for log lines (never the password)."""
        return parse_redis_url(self.redis_url).redacted()

    def redacted_store(self) -> str:
        """Return the store URL with any password replaced by ``***``, for log lines."""
        return redact(self.store_url)


@dataclass(frozen=True, slots=True, kw_only=True)
class KafkaSettings:
    """Where and as which group the pod consumes (:attr:`PodConfig.kafka`).

    Each field is the :class:`PodConfig` field of the same name.
    """

    bootstrap_servers: str
    group: str
    kafka_security: KafkaSecurity
    dead_letter_topic: str | None
    max_payload_bytes: int
    auto_offset_reset: str


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupTiming:
    """Consumer group membership timing, in seconds (:attr:`PodConfig.group_timing`).

    Each field is the :class:`PodConfig` field or property of the same
    name: ``heartbeat`` is the interval in effect, ``rebalance_timeout`` the
    one sized from ``revoke_timeout``.
    """

    session_timeout: float
    heartbeat: float
    max_poll_interval: float
    poll_timeout: float
    revoke_timeout: float
    rebalance_timeout: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeouts:
    """Every call and wait bound, in seconds (:attr:`PodConfig.timeouts`).

    Each field is the :class:`PodConfig` field of the same name.
    """

    shutdown_timeout: float
    commit_timeout: float
    kafka_timeout: float
    redis_timeout: float
    store_timeout: float
    startup_retry_cap: float


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseSettings:
    """The lease Redis and how lease calls reach it (:attr:`PodConfig.leases`).

    Each field is the :class:`PodConfig` field of the same name; the URL
    (which may carry a password) is left out of the repr.
    """

    redis_url: str = field(repr=False)
    redis_url_file: Path | None
    namespace: str
    redis_timeout: float
    lease_pipelining: bool
    lease_replicas: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreSettings:
    """The fenced completion store (:attr:`PodConfig.store`).

    Each field is the :class:`PodConfig` field of the same name; the URL
    (which may carry a password) is left out of the repr.
    """

    store_url: str = field(repr=False)
    store_url_file: Path | None
    store_timeout: float
    outbox_retention: float
    outbox_claim_timeout: float
    outbox_relay_connections: int | None


_View = TypeVar("_View", KafkaSettings, GroupTiming, Timeouts, LeaseSettings, StoreSettings)


def _view(config: PodConfig, kind: type[_View]) -> _View:
    """Build the ``kind`` view of ``config``: each of its fields read from ``config``."""
    return kind(**{f.name: getattr(config, f.name) for f in dataclasses.fields(kind)})


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)
