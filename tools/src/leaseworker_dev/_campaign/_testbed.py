"""The campaign's services and pods: Kafka, Redis (one node or Sentinel), the store, N pods.

:func:`services` takes the local services from the one stack builder
(:class:`~leaseworker_dev._services.LocalStack`), in parallel, and
stops each one it started by PID on the way out. The completion store is a
private PostgreSQL behind a :class:`~leaseworker.testing.ChaosProxy` (so it
can be taken away), or, without PostgreSQL installed, an SQLite file. A pod
is the one pod process (:class:`~leaseworker_dev._services.PodProcess`) of the
user's job through the stall wrapper, with its own Redis proxy on the
single-node topology, its own history file and a ``/readyz`` to wait for; a
job that marks when its processes ran (``crunch``) writes under :func:`marks_dir`.

With ``hosts`` (``--hosts``) Redis, Kafka (each broker), PostgreSQL and each
pod run on a network namespace of their own (:class:`~leaseworker_dev._services.Hosts`),
and pods reach the services directly, without proxies: the partition faults
cut a pod's host from Redis's, or from every other host.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from leaseworker.toolkit import ChaosProxy, ConfigError, KafkaSecurity

from .._services import (
    HERE,
    MARKS_VARIABLE,
    NODE_IDS,
    Hosts,
    LocalKafka,
    LocalKafkaCluster,
    LocalPostgres,
    LocalPostgresPair,
    LocalRedis,
    LocalRedisCluster,
    LocalSentinelGroup,
    LocalStack,
    Place,
    PodProcess,
    Service,
    ToolMissingError,
    WallClock,
    pod_process,
)
from ._stall import DIR_VARIABLE, JOB_VARIABLE

Topology = Literal["single", "sentinel", "cluster"]
Standby = Literal["sync", "async"]
"""How the store's PostgreSQL standby replicates: commits wait for it, or not."""
"""A campaign pod is the one pod process."""

REDIS_TIMEOUT = 0.5
"""The pods' ``--redis-timeout``: a rejected renewal's answer comes within it."""

POD_FLAGS = (
    *("--session-timeout", "6", "--heartbeat-interval", "1", "--revoke-timeout", "2"),
    *("--shutdown-timeout", "3", "--redis-timeout", str(REDIS_TIMEOUT), "--store-timeout", "2"),
    *("--max-poll-interval", "20"),
)
"""Short Kafka and call timings, so hand-overs take seconds (the job's lease is its own)."""

AUTO_CREATE = {"auto.create.topics.enable": "true", "num.partitions": "1"}
"""The campaign's broker creates a job's effects topic on its first message, one partition."""


@dataclass
class Services:
    """The running services; ``store_url`` is the campaign's direct view of the store."""

    stack: LocalStack
    workdir: Path
    store_url: str
    store_proxy: ChaosProxy | None = None  # set by :func:`store_proxy`
    external_kafka: str | None = None  # ``--bootstrap-servers``: not ours to restart
    kafka_security: KafkaSecurity = field(default_factory=KafkaSecurity)
    hosts: Hosts | None = None  # ``--hosts``: every service and pod on a host of its own

    def pod_place(self, name: str) -> Place:
        """Where pod ``name`` runs: a host of its own with ``hosts``, else here."""
        return HERE if self.hosts is None else self.hosts.add(name).place

    postgres_pair: LocalPostgresPair | None = None  # the store on a primary and standby

    @property
    def kafka(self) -> LocalKafka:
        """The campaign's own broker (not with ``external_kafka``)."""
        return self.stack.kafka

    @property
    def kafka3(self) -> LocalKafkaCluster | None:
        """The campaign's own three brokers, when it runs on them."""
        found: LocalKafkaCluster | None = self.stack.get("kafka3")
        return found

    @property
    def bootstrap_servers(self) -> str:
        """Where every client of the campaign reaches Kafka."""
        if self.external_kafka:
            return self.external_kafka
        return (self.kafka3 or self.kafka).bootstrap_servers

    def kafka_kwargs(self) -> dict[str, Any]:
        """Return aiokafka's keyword arguments for the brokers' SASL/TLS (none on our own)."""
        return self.kafka_security.client_kwargs()

    def pod_env(self) -> dict[str, str]:
        """Return the ``LEASEWORKER_KAFKA_*`` variables giving a pod the same SASL/TLS."""
        security = self.kafka_security
        values = {
            "SECURITY_PROTOCOL": security.protocol,
            "SASL_MECHANISM": security.sasl_mechanism,
            "SASL_USERNAME": security.sasl_username,
            "SASL_PASSWORD": security.sasl_password,
            "SASL_PASSWORD_FILE": security.sasl_password_file,
            "CA_FILE": security.ssl_cafile,
            "CERT_FILE": security.ssl_certfile,
            "KEY_FILE": security.ssl_keyfile,
        }
        return {f"LEASEWORKER_KAFKA_{k}": str(v) for k, v in values.items() if v}

    @property
    def redis(self) -> LocalRedis | None:
        """The single node (``None`` on a replicated topology)."""
        found: LocalRedis | None = self.stack.get("redis")
        return found

    @property
    def sentinel(self) -> LocalSentinelGroup | None:
        """The Sentinel group, on that topology."""
        found: LocalSentinelGroup | None = self.stack.get("sentinel")
        return found

    @property
    def cluster(self) -> LocalRedisCluster | None:
        """The Redis Cluster, on that topology."""
        found: LocalRedisCluster | None = self.stack.get("cluster")
        return found

    @property
    def postgres(self) -> LocalPostgres | None:
        """The private PostgreSQL (``None`` with ``--store-url`` or without PostgreSQL)."""
        found: LocalPostgres | None = self.stack.get("postgres")
        return found

    @property
    def shared_redis_url(self) -> str:
        """The URL of a replicated topology (pods connect to it directly, no proxy)."""
        if self.sentinel is not None:
            return self.sentinel.url
        assert self.cluster is not None
        return self.cluster.url

    @property
    def redis_port(self) -> int:
        """The single node's port (pods' proxies forward to it)."""
        assert self.redis is not None
        return self.redis.port


@contextlib.contextmanager
def services(
    topology: Topology,
    store_url: str | None,
    workdir: Path,
    *,
    bootstrap_servers: str | None = None,
    kafka_security: KafkaSecurity | None = None,
    kafka_brokers: int = 1,
    hosts: bool = False,
    postgres_standby: Standby | None = None,
) -> Iterator[Services]:
    """Start Kafka (without ``bootstrap_servers``), Redis, a PostgreSQL (without ``store_url``).

    ``kafka_security``: how every client reaches the external brokers.
    ``kafka_brokers``: 3 for a three-broker cluster instead of one broker.
    ``hosts``: each service on a host of its own (single topology, own services only).
    ``postgres_standby``: the store on a primary and a streaming standby of
    that mode (:class:`LocalPostgresPair`), reached by its multi-host URL.
    """
    if hosts and (topology != "single" or store_url or bootstrap_servers or postgres_standby):
        raise ValueError("hosts: the single topology, with the campaign's own Kafka and store")
    with contextlib.ExitStack() as exits:
        made = exits.enter_context(Hosts.create()) if hosts else None
        yield exits.enter_context(
            _services(
                topology,
                store_url,
                workdir,
                bootstrap_servers=bootstrap_servers,
                kafka_security=kafka_security,
                kafka_brokers=kafka_brokers,
                hosts=made,
                postgres_standby=postgres_standby,
            )
        )


@contextlib.contextmanager
def _services(
    topology: Topology,
    store_url: str | None,
    workdir: Path,
    *,
    bootstrap_servers: str | None,
    kafka_security: KafkaSecurity | None,
    kafka_brokers: int,
    hosts: Hosts | None,
    postgres_standby: Standby | None,
) -> Iterator[Services]:
    """:func:`services` on ``hosts`` (``None``: here, on loopback)."""
    # Each host made here, before the starts' threads: Hosts.add is not thread-safe.
    at: dict[str, dict[str, Any]] = {"kafka": {}, "kafka3": {}, "postgres": {}, "redis": {}}
    if hosts is not None:
        at["redis"] = {"place": hosts.add("redis").place}
        at["postgres"] = {"place": hosts.add("store").place}
        if kafka_brokers == 3:
            at["kafka3"] = {"places": {i: hosts.add(f"broker-{i}").place for i in NODE_IDS}}
        else:
            at["kafka"] = {"place": hosts.add("kafka").place}
    redis: dict[Topology, Service] = {
        "single": "redis",
        "sentinel": "sentinel",
        "cluster": "cluster",
    }
    kafka = functools.partial(LocalKafka.start, settings=AUTO_CREATE, **at["kafka"])
    kafka3 = functools.partial(LocalKafkaCluster.start, settings=AUTO_CREATE, **at["kafka3"])
    starters: dict[Service, Callable[[], Any]] = {"kafka": kafka, "kafka3": kafka3}
    starters["postgres"] = functools.partial(LocalPostgres.start, **at["postgres"])
    starters["redis"] = functools.partial(LocalRedis.start, **at["redis"])
    if topology == "single":  # on a wall clock redis_clock_step steps
        with contextlib.suppress(ToolMissingError):  # no C compiler: that fault is not played
            clock = WallClock.create(workdir)
            starters["redis"] = functools.partial(LocalRedis.start, clock=clock, **at["redis"])
    with LocalStack(starters=starters) as stack:
        ours: Service = "kafka3" if kafka_brokers == 3 else "kafka"
        own: list[Service] = [] if bootstrap_servers else [ours]
        single_store = store_url is None and postgres_standby is None
        optional: list[Service] = ["postgres"] if single_store else []
        stack.start(*own, redis[topology], optional=optional)
        with contextlib.ExitStack() as pairs:
            pair = None
            if postgres_standby is not None:
                pair = LocalPostgresPair.start(synchronous=postgres_standby == "sync")
                pairs.callback(pair.stop)
                store_url = pair.url
            if store_url is None:
                postgres = stack.get("postgres")
                store_url = postgres.url if postgres else f"sqlite:///{workdir / 'completions.db'}"
            yield Services(
                stack=stack,
                workdir=workdir,
                store_url=store_url,
                external_kafka=bootstrap_servers,
                kafka_security=kafka_security or KafkaSecurity(),
                hosts=hosts,
                postgres_pair=pair,
            )


@contextlib.asynccontextmanager
async def store_proxy(stack: Services) -> AsyncIterator[str]:
    """Yield the store URL the pods use: through a proxy when the store is our PostgreSQL.

    Not on hosts: pods there reach the store directly (a proxy here listens on loopback).
    """
    if stack.postgres is None or stack.hosts is not None:
        yield stack.store_url
        return
    async with ChaosProxy(stack.postgres.port) as proxy:
        stack.store_proxy = proxy
        yield stack.store_url.replace(f":{stack.postgres.port}/", f":{proxy.port}/")


def make_pod(
    name: str,
    *,
    job: str,
    redis_url: str,
    store_url: str,
    flags: list[str],
    workdir: Path,
    proxy: ChaosProxy | None,
    kafka_env: dict[str, str] | None = None,
    place: Place = HERE,
) -> PodProcess:
    """Describe pod ``name`` running ``job`` from the current directory (not started yet).

    ``kafka_env``: its Kafka SASL/TLS variables (:meth:`Services.pod_env`), not on argv.
    ``place``: where it runs (:meth:`Services.pod_place`).
    """
    env = {JOB_VARIABLE: job, DIR_VARIABLE: str(workdir), "LEASEWORKER_STORE_URL": store_url}
    env[MARKS_VARIABLE] = str(marks_dir(workdir))
    env |= kafka_env or {}
    return pod_process(
        name,
        "leaseworker_dev._campaign._stall:StallingJob",
        workdir=workdir,
        redis_url=redis_url,
        flags=flags,
        env=env,
        proxy=proxy,
        place=place,
    )


def marks_dir(workdir: Path) -> Path:
    """Where the pods' jobs leave their executions' marks (``leaseworker_dev._services.crunch``)."""
    return workdir / "marks"


def refused(exc: BaseException) -> bool:
    """Tell whether ``exc`` is (or a task group wraps) a ``ConfigError``: a refused credential."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(ConfigError) is not None
    return isinstance(exc, ConfigError)
