"""The one local stack builder: any set of the local services, each started at most once.

The demo, the fault campaign, the test suite, the pytest plugin and the
benches all take their services from a :class:`LocalStack`: name the ones a
run needs and :meth:`LocalStack.start` brings them up in parallel threads (a
JVM, a Go binary and a database start in about the time of the slowest), or
ask for one (``stack.redis``) and it starts on first use. :meth:`LocalStack.stop`
stops every service started, newest first, by PID, also after a failed start
or Ctrl-C: whatever came up is recorded before the error is raised.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any, Literal, Self, TypeVar, cast, final

from ._cluster import LocalRedisCluster
from ._kafka import LocalKafka
from ._kafka_cluster import LocalKafkaCluster
from ._local_jaeger import LocalJaeger
from ._local_postgres import LocalPostgres
from ._redis import LocalRedis
from ._sentinel import LocalSentinelGroup

Service = Literal["redis", "sentinel", "cluster", "kafka", "kafka3", "postgres", "jaeger"]

STARTERS: dict[Service, Callable[[], Any]] = {
    "redis": LocalRedis.start,
    "sentinel": LocalSentinelGroup.start,
    "cluster": LocalRedisCluster.start,
    "kafka": LocalKafka.start,
    "kafka3": LocalKafkaCluster.start,
    "postgres": LocalPostgres.start,
    "jaeger": LocalJaeger.start,
}
"""How each service starts (tests and benches may swap one, say a two-replica Sentinel)."""

NOT_INSTALLED = (FileNotFoundError, RuntimeError)
"""What a start raises when a service's software is missing here (for ``optional`` starts)."""

T = TypeVar("T")


@final
class LocalStack:
    """Local services on loopback ports, started once each, stopped together.

    ::

        with LocalStack() as stack:
            stack.start("redis", "kafka", optional=["jaeger"])
            print(stack.kafka.bootstrap_servers, stack.jaeger)  # jaeger None if not built

    ``starters`` overrides entries of :data:`STARTERS`. Thread-safe: session
    fixtures of a parallel test run may ask for services at once.
    """

    def __init__(self, starters: dict[Service, Callable[[], Any]] | None = None) -> None:
        self._starters = {**STARTERS, **(starters or {})}
        self._running: dict[Service, Any] = {}
        self._lock = threading.RLock()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self, *names: Service, optional: Iterable[Service] = ()) -> None:
        """Start every named service not running yet, in parallel; wait for all of them.

        An ``optional`` one whose software is missing (:data:`NOT_INSTALLED`; for
        Jaeger: not built) stays off. The first failure of the others is raised
        once every start has ended, with the services that came up recorded.
        """
        with self._lock:  # one start at a time: a service never starts twice
            wanted = [n for n in dict.fromkeys([*names, *optional]) if n not in self._running]
            optional = set(optional) - set(names)
            if (
                "jaeger" in optional
                and "jaeger" in wanted
                and not LocalJaeger.binary_path().is_file()
            ):
                wanted.remove("jaeger")  # building it takes minutes: never as a side effect
            if wanted:
                self._start(wanted, optional)

    def _start(self, wanted: list[Service], optional: set[Service]) -> None:
        pool = ThreadPoolExecutor(max_workers=len(wanted), thread_name_prefix="stack-start")
        futures = {name: pool.submit(self._starters[name]) for name in wanted}
        try:
            for future in futures.values():
                future.exception()  # waits; Ctrl-C here still waits for the others below
        finally:
            pool.shutdown(wait=True)
            self._record(futures)
        for name, future in futures.items():
            failure = future.exception()
            missing = name in optional and isinstance(failure, NOT_INSTALLED)
            if failure is not None and not missing:
                raise failure

    def get(self, name: Service) -> Any | None:
        """Return the running service ``name``, or ``None`` when it was not started."""
        return self._running.get(name)

    @property
    def redis(self) -> LocalRedis:
        """One ``redis-server`` (started on first use)."""
        return self._use("redis", LocalRedis)

    @property
    def sentinel(self) -> LocalSentinelGroup:
        """A Sentinel group: a master, replicas, three sentinels (started on first use)."""
        return self._use("sentinel", LocalSentinelGroup)

    @property
    def cluster(self) -> LocalRedisCluster:
        """A six-node Redis Cluster (started on first use)."""
        return self._use("cluster", LocalRedisCluster)

    @property
    def kafka(self) -> LocalKafka:
        """One Kafka broker in KRaft mode (started on first use)."""
        return self._use("kafka", LocalKafka)

    @property
    def kafka3(self) -> LocalKafkaCluster:
        """Three KRaft Kafka nodes, RF 3 and min ISR 2 (started on first use)."""
        return self._use("kafka3", LocalKafkaCluster)

    @property
    def postgres(self) -> LocalPostgres:
        """A PostgreSQL cluster (started on first use)."""
        return self._use("postgres", LocalPostgres)

    @property
    def jaeger(self) -> LocalJaeger:
        """A Jaeger with in-memory storage (started, and built if needed, on first use)."""
        return self._use("jaeger", LocalJaeger)

    def stop(self) -> None:
        """Stop every running service by PID, newest first (one failing stop skips none)."""
        with self._lock:
            running, self._running = list(self._running.values()), {}
        for service in reversed(running):
            with contextlib.suppress(Exception):
                service.stop()

    def _use(self, name: Service, kind: type[T]) -> T:
        """Return service ``name`` (a ``kind``: :data:`STARTERS` say which), starting it once."""
        with self._lock:
            if name not in self._running:
                self.start(name)
            return cast(T, self._running[name])

    def _record(self, futures: dict[Service, Future[Any]]) -> None:
        with self._lock:
            for name, future in futures.items():
                if future.done() and not future.cancelled() and future.exception() is None:
                    self._running[name] = future.result()
