"""The worker pod: one job class, one trigger source, one lease store.

The :class:`Pod` joins the pieces: it waits for Redis and opens the
completion store (retrying with a log line, never crash-looping silently),
builds the :class:`Executor` and the Kafka source, and runs the trigger's way
between them (``_way``: poll to commit). :func:`serve`
adds signal handling: the first SIGTERM/SIGINT stops fetching and drains, a
second one exits at once.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.machinery
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterable
from typing import final

import anyio
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import RedisError

from .._errors import StoreUnavailable
from .._events import Hook
from .._execution import (
    ExecutionObserver,
    Executor,
    LoggingObserver,
    ObserverHook,
    ReportJob,
)
from .._kafka import KafkaTriggerSource, SourceStats
from .._lease import (
    LeaseStore,
    RedisLeases,
    check_redis,
    parse_redis_url,
    ping_redis,
    redis_from_url,
    start_refusal,
)
from .._process import ProcessPool
from .._retry import Retries, startup
from .._store import Barrier, CompletionStore, open_store
from .._telemetry import Telemetry
from ._config import PodConfig
from ._pod_relay import outbox_relay
from ._recorder import HistoryRecorder
from ._way import TriggerWay

logger = logging.getLogger("leaseworker.pod")


@final
class Pod:
    """Run ``job`` for every trigger on ``job.topic`` until stopped.

    ::

        worker = Pod(MonthlyReport(), PodConfig(bootstrap_servers="kafka:9092",
                                                      redis_url="redis://redis:6379/0"))
        await serve(worker)          # or: await worker.run(), and worker.stop() to end

    ``leases`` replaces the Redis lease store built from ``config.redis_url``
    (tests pass one routed through a chaos proxy); ``hooks`` receive every
    lifecycle event (execution, lease and Kafka source; see
    :class:`~leaseworker.Hook`), after the logging hook
    (:class:`LoggingObserver`, or ``observer`` in its place: deprecated, an
    object with ``on_event``, or a hook); ``telemetry`` turns every lifecycle
    step into OpenTelemetry spans and metrics on its injected providers
    (default: none), as one more hook. ``store`` replaces the
    completion store the worker opens from ``config.store_url`` for the
    duration of :meth:`run` (the caller then owns it). The job's lease settings
    are checked here (:class:`~leaseworker.ConfigError`). ``recorder``
    appends every execution to a history file (``--record-history``).
    ``processes`` replaces the pool of ``ctx.run_in_process`` the pod starts
    from ``config.process_workers`` (the caller then starts and closes it).
    """

    def __init__(
        self,
        job: ReportJob,
        config: PodConfig,
        *,
        leases: LeaseStore | None = None,
        observer: ExecutionObserver | Hook | None = None,
        telemetry: Telemetry | None = None,
        store: CompletionStore | None = None,
        recorder: HistoryRecorder | None = None,
        hooks: Iterable[Hook] = (),
        processes: ProcessPool | None = None,
    ) -> None:
        self._job = job
        self._config = config
        self._own_processes = processes is None  # started and closed by run()
        module = type(job).__module__
        self._processes = processes or ProcessPool(
            config.process_workers,
            max_tasks_per_child=config.max_tasks_per_child,
            max_memory_per_child=config.max_memory_per_child,
            preload=(module,) if _importable(module) else (),
        )
        self._store = store
        self._redis: Redis | RedisCluster | None = None
        self._own_leases: RedisLeases | None = None  # built here from the URL: closed here
        if leases is None:
            self._redis = redis_from_url(
                config.redis_url,
                connect_timeout=config.redis_timeout,
                url_file=config.redis_url_file,
            )
            leases = self._own_leases = RedisLeases(
                self._redis,
                namespace=config.namespace,
                command_timeout=config.redis_timeout,
                owner_prefix=config.pod,  # owner tokens read "<pod>:<random>"
                pipelining=config.lease_pipelining,
                replicas=config.replicas,
            )
        self._leases = leases
        telemetry = telemetry or Telemetry()
        pod = telemetry.instrument(pod=config.pod, group=config.group)
        logging_hook = _as_hook(observer or LoggingObserver(log_job_errors=config.log_job_errors))
        self._hooks: tuple[Hook, ...] = (logging_hook, *hooks)
        self._pod = pod if telemetry.enabled else None  # none: spare every trigger its spans
        if self._pod is not None:
            self._hooks = (*self._hooks, self._pod)
        if recorder is not None:
            self._hooks = (*self._hooks, recorder)
        self._durable: Barrier | None = None  # the store's, once open (_make_executor)
        self._executor = self._make_executor(store)
        self._source = KafkaTriggerSource(
            config,
            topic=job.topic,
            resolve_key=job.job_key,
            hooks=self._hooks,
            barrier=self._barrier,
        )

    @property
    def stats(self) -> SourceStats:
        """The Kafka source's counters (assignments, commits, pauses, in-flight...)."""
        return self._source.stats

    def stop(self) -> None:
        """Stop fetching; ``run()`` returns once in-flight work ended (bounded).

        Call it on the worker's event loop (from another thread, through
        ``anyio.from_thread.run_sync``): it wakes the loop's waiters.
        """
        self._source.stop()

    async def ping_redis(self) -> None:
        """PING the lease Redis once within ``redis_timeout`` (for readiness); raise if not.

        A worker given its own ``leases`` has no client of its own: nothing to ping.
        """
        if self._redis is not None:
            with anyio.fail_after(self._config.redis_timeout):
                await ping_redis(self._redis, self._own_leases)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Wait for Redis, then consume triggers until :meth:`stop`.

        ``task_status.started()`` is called once Kafka is connected, or when
        the worker is stopped before it ever got there (``run`` then returns).
        What waiting cannot fix raises :class:`~leaseworker.ConfigError` with a
        one-line reason: Redis refusing the credentials, a store that cannot
        exist, a missing topic (``leaseworker run`` exits 2).
        """
        self._log_start()
        try:
            if not await self._wait_for_redis():
                task_status.started()  # stopped before Redis answered: nothing to wait for
                return
            async with contextlib.AsyncExitStack() as stack:
                if self._own_processes:  # warm before the first trigger; none left after
                    await stack.enter_async_context(self._processes)
                await self._consume(task_status)
        finally:
            if self._redis is not None:
                with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                    if self._own_leases is not None:
                        await self._own_leases.aclose()
                    await self._redis.aclose()

    async def _consume(self, task_status: anyio.abc.TaskStatus[None]) -> None:
        """Open the store (unless given one) and run the trigger's way until stopped."""
        if self._store is not None:
            async with outbox_relay(self._store, self._config, self._hooks, self._leases):
                await self._way().run(task_status=task_status)
            return
        async with self._open_store() as store:
            if store is None:
                task_status.started()  # stopped before the store opened
                return
            self._executor = self._make_executor(store)
            async with outbox_relay(store, self._config, self._hooks, self._leases):
                await self._way().run(task_status=task_status)

    def _log_start(self) -> None:
        """Say what this pod runs and where it connects (no credentials)."""
        job = type(self._job)
        config = self._config
        logger.info(
            "pod %s starting: job %s:%s on topic %s, group %s, Redis %s, store %s",
            config.pod,
            job.__module__,
            job.__qualname__,
            self._job.topic,
            config.group,
            config.redacted_redis() if self._redis is not None else "given by the caller",
            config.redacted_store() if self._store is None else "given by the caller",
            extra={"event": "pod_starting", "pod": config.pod},
        )

    def _make_executor(self, store: CompletionStore | None) -> Executor:
        # Every offset commit awaits the store's barrier first (_barrier), so the
        # executions take the store's answers as they come (settled_by_offsets).
        self._durable = None if store is None else store.durable
        answers = None if store is None else store.settled_by_offsets()
        return Executor(
            self._job,
            self._leases,
            pod=self._config.pod,
            hooks=self._hooks,
            lease_note=None if self._pod is None else self._pod.lease_note,
            store=answers,
            store_namespace=self._config.namespace,
            loss_budget=self._config.loss_budget,
            max_result_bytes=self._config.max_result_bytes,
            processes=self._processes,
        )

    @contextlib.asynccontextmanager
    async def _open_store(self) -> AsyncIterator[CompletionStore | None]:
        """Open ``config.store_url``, retrying with a log line while it is unavailable.

        Yields ``None`` when the worker is stopped before the store opened.
        """
        config = self._config
        retries = Retries(startup(config.startup_retry_cap), sleep=self._source.backoff)
        async with contextlib.AsyncExitStack() as stack:
            while True:
                try:
                    opening = open_store(
                        config.store_url,
                        call_timeout=config.store_timeout,
                        relay_connections=config.outbox_relay_connections,
                        url_file=config.store_url_file,
                    )
                    store = await stack.enter_async_context(opening)
                except StoreUnavailable as exc:
                    log = functools.partial(_store_unavailable, config, exc, self._source)
                    if not await retries.wait(log):
                        yield None
                        return
                    continue
                break
            self._source.waiting_for(None)
            logger.info(
                "completion store %s open",
                config.redacted_store(),
                extra={"event": "store_opened", "pod": config.pod},
            )
            yield store

    def _way(self) -> TriggerWay:
        """Return the trigger's way from the source to the executor (of the store now open)."""
        return TriggerWay(self._source, self._executor)

    async def _barrier(self) -> None:
        """Before an offset commit: what the store answered so far is on disk."""
        if self._durable is not None:
            await self._durable()

    async def _wait_for_redis(self) -> bool:
        """PING Redis until it answers, logging each failure with the next retry time.

        Returns ``False`` when the worker is stopped before Redis answered.
        """
        if self._redis is None:
            return True
        retries = Retries(startup(self._config.startup_retry_cap), sleep=self._source.backoff)
        while True:
            try:
                with anyio.fail_after(self._config.redis_timeout * 2):
                    await ping_redis(self._redis, self._own_leases)
            except (RedisError, OSError, TimeoutError) as exc:
                target = parse_redis_url(self._config.redis_url)
                where, bound = self._config.redacted_redis(), self._config.redis_timeout
                refused = await start_refusal(exc, target, where=where, bound=bound)
                if refused is not None:  # credentials, an ACL, TLS: waiting does not heal them
                    raise refused from None
                log = functools.partial(_redis_unavailable, self._config, exc, self._source)
                if not await retries.wait(log):
                    return False
                continue
            if self._own_leases is not None:  # the URL's topology and the ACL, tried once
                await check_redis(
                    self._redis,
                    self._own_leases,
                    target=parse_redis_url(self._config.redis_url),
                    where=self._config.redacted_redis(),
                    bound=self._config.redis_timeout,
                )
            self._source.waiting_for(None)
            if retries.count:
                logger.info(
                    "Redis at %s answered after %d attempt(s)",
                    self._config.redacted_redis(),
                    retries.count + 1,
                    extra={"event": "redis_connected", "pod": self._config.pod},
                )
            await self._warn_if_leases_can_be_evicted()
            return True

    async def _warn_if_leases_can_be_evicted(self) -> None:
        """Log a warning when Redis may evict keys under memory pressure.

        Lease keys carry a TTL, the first keys ``volatile-*`` policies evict,
        and an evicted lease lets a second pod start early. A Redis that does
        not allow ``CONFIG GET`` (many managed ones) is not checked.
        """
        assert self._redis is not None
        try:
            with anyio.fail_after(self._config.redis_timeout):
                found = await self._redis.config_get("maxmemory*")
        except (RedisError, OSError, TimeoutError):
            return
        if not all(isinstance(value, bytes | str) for value in found.values()):
            return  # a cluster answers per node: not checked here
        config = {_text(name): _text(value) for name, value in found.items()}
        policy = config.get("maxmemory-policy", "noeviction")
        if config.get("maxmemory", "0") != "0" and policy != "noeviction":
            logger.warning(
                "Redis at %s may evict lease keys (maxmemory-policy %s): an evicted lease "
                "lets another pod start early; use maxmemory-policy noeviction",
                self._config.redacted_redis(),
                policy,
                extra={"event": "redis_eviction_policy", "pod": self._config.pod},
            )


def _importable(module: str) -> bool:
    """Whether a fresh interpreter on this ``sys.path`` finds ``module`` by its name.

    The pod preloads its job's module in every process worker; a module run
    as ``__main__`` or loaded from a file by path is not found there (the
    job's ``run_in_process`` calls then name their own importable module).
    """
    top = module.partition(".")[0]
    return top != "__main__" and importlib.machinery.PathFinder.find_spec(top, sys.path) is not None


def _as_hook(observer: ExecutionObserver | Hook) -> Hook:
    """Return ``observer`` as a hook: a deprecated ``on_event`` observer is adapted."""
    if isinstance(observer, LoggingObserver) or not hasattr(observer, "on_event"):
        return observer
    return ObserverHook(observer)  # type: ignore[arg-type]


def _store_unavailable(
    config: PodConfig,
    exc: BaseException,
    source: KafkaTriggerSource,
    delay: float,
    attempt: int,
) -> None:
    source.waiting_for(f"{exc}; retrying in {delay:.1f}s (attempt {attempt})")
    logger.warning(
        "%s; retrying in %.1fs (attempt %d)",
        exc,
        delay,
        attempt,
        extra={"event": "store_unavailable", "pod": config.pod},
    )


def _redis_unavailable(
    config: PodConfig,
    exc: BaseException,
    source: KafkaTriggerSource,
    delay: float,
    attempt: int,
) -> None:
    why = f"Redis at {config.redacted_redis()} unavailable ({type(exc).__name__})"
    source.waiting_for(f"{why}; retrying in {delay:.1f}s (attempt {attempt})")
    logger.warning(
        "%s; retrying in %.1fs (attempt %d)",
        why,
        delay,
        attempt,
        extra={"event": "redis_unavailable", "pod": config.pod},
    )


def _text(value: bytes | str | None) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def serve(worker: Pod) -> None:
    """Run ``worker`` until SIGTERM/SIGINT; a second signal exits the process at once.

    The first signal stops fetching and lets in-flight jobs finish until the
    shutdown timeout, then cancels them (their leases are released) and
    commits what completed. The second one calls ``os._exit(128 + signal)``:
    no cleanup; leases expire by TTL and uncommitted triggers are redelivered.
    """
    async with anyio.create_task_group() as tg:
        tg.start_soon(_watch_signals, worker)
        await worker.run()
        tg.cancel_scope.cancel()


async def _watch_signals(worker: Pod) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        received = 0
        async for signum in signals:
            received += 1
            name = signal.Signals(signum).name
            if received == 1:
                logger.info(
                    "%s received: draining (send it again to exit at once)",
                    name,
                    extra={"event": "signal", "signal": name},
                )
                worker.stop()
                continue
            logger.warning(
                "second %s: exiting now without cleanup",
                name,
                extra={"event": "signal", "signal": name},
            )
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            os._exit(128 + signum)
