"""Triggers from Kafka: the consumer-group member whose polls become executions.

The source hands out each poll's records and keeps their offsets; what
becomes of a record is the pod's way (``leaseworker._worker._way``), which
drives the source's plain operations. The loop never stops polling while
jobs run (that keeps the pod in its group); at the concurrency limit it
pauses every assigned partition instead. Commits, rebalances, dead letters
and start-up live in their own modules beside it.
See docs/design.md#the-kafka-source.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from typing import Any, final

import anyio
from aiokafka import TopicPartition  # type: ignore[import-untyped]
from aiokafka.errors import KafkaConnectionError, KafkaError  # type: ignore[import-untyped]

from .._errors import MalformedTrigger
from .._events import Hook
from .._execution import Ending, Trigger, decode_trigger, resolve_job_key
from .._retry import Retries, startup
from .._store import Barrier
from . import _kafka_clients
from ._commits import Commits
from ._dead_letters import DeadLetters, Headers
from ._kafka_clients import ConsumerFactory, ProducerFactory, new_consumer, new_producer
from ._log_names import describe, logger
from ._logins import Login
from ._rebalance import Rebalance
from ._refusals import check_refused, refused_error
from ._settings import SourceSettings
from ._state import Partition, SourceState, SourceStats, release_grace
from ._topics import require_topics

Taken = list[tuple[Partition, Any]]
"""One poll's records handed out (aiokafka's ``ConsumerRecord``), each with its partition."""

TopicCheck = Callable[[SourceSettings, list[str]], Awaitable[None]]
"""Raise ConfigError if a topic is missing (:func:`check_topics` by default)."""

ResolveKey = Callable[[Trigger], str]
"""Return a trigger's job key (``ReportJob.job_key``)."""

GATHER_SHARE = 0.75
"""The share of slots a full pod's next poll waits to see free: under load slots free one at
a time, and a poll's executions share lookups, store batches and lease pipelines."""
GATHER_WINDOW = 0.010
"""How long, at most, a poll waits for them (seconds); a pod that was not full never waits."""


@final
class KafkaTriggerSource:
    """One consumer-group member on ``topic``: its polls, pauses, commits and dead letters.

    The pod's way (``leaseworker._worker._way``) drives it through plain
    operations: inside :meth:`joined` it takes each poll's records, reads
    them with :meth:`decode`, runs each in its task (:meth:`start`) between
    :meth:`processing` and :meth:`processed`, which marks the offset done
    when its end was terminal, and sets aside what cannot or did not end
    well (:meth:`malformed`, :meth:`dead_letter`).

    ``resolve_key`` maps a decoded trigger to its job key. Records that
    cannot become a job, and triggers whose job ended ``failed`` or
    ``timed_out``, go to ``config.dead_letter_topic`` (when set), are logged
    and committed. The polls end after :meth:`stop` once in-flight work has
    finished or was cancelled at ``config.shutdown_timeout``. ``hooks``
    receive a :class:`~leaseworker._events.SourceEvent` for every step of its
    records and partitions (the pod's telemetry, a test's waits; default:
    none). ``consumer_factory`` and ``producer_factory`` build its aiokafka
    clients (a test passes stand-ins); the consumer is subscribed with the
    source's rebalance listener before it starts. ``topic_check(config,
    topics)`` runs before the consumer starts and raises ConfigError for a
    missing topic (default: :func:`check_topics` with the default consumer
    factory, none with a stand-in). ``barrier`` is awaited before each
    offset commit (see :class:`~._commits.Commits`).
    """

    def __init__(
        self,
        config: SourceSettings,
        *,
        topic: str,
        resolve_key: ResolveKey,
        hooks: Iterable[Hook] = (),
        consumer_factory: ConsumerFactory = new_consumer,
        producer_factory: ProducerFactory = new_producer,
        topic_check: TopicCheck | None = None,
        barrier: Barrier | None = None,
    ) -> None:
        self._config = config
        self._topic = topic
        self._resolve_key = resolve_key
        self._consumer_factory = consumer_factory
        self._producer_factory = producer_factory
        self._topic_check = topic_check
        if topic_check is None and consumer_factory is new_consumer:
            self._topic_check = check_topics  # real clients: check the real topics
        self._state = SourceState(hooks)
        self.stats = self._state.stats
        self._consumer: Any = None
        self._producer: Any = None
        self._listener: Rebalance | None = None
        self._tasks: anyio.abc.TaskGroup | None = None  # the records' tasks, while joined
        self._login = Login(config.kafka_security)
        self._stop_deadline = 0.0
        self._cancelled_all = False
        self._startup = startup(config.startup_retry_cap)
        self._commits = Commits(self._state, config, self._send_commit, barrier)
        self._dead_letters = DeadLetters(
            config, self._state, self._send_dead_letter, backoff=self._startup
        )

    def stop(self) -> None:
        """Stop fetching; in-flight executions get ``shutdown_timeout`` to finish."""
        if not self._state.stopping:
            self._state.stopping = True
            self.stats.membership = "stopping"
            self._stop_deadline = anyio.current_time() + self._config.shutdown_timeout
            logger.info(
                "stopping: no new triggers; %d in flight get %.1fs to finish",
                self.stats.in_flight,
                self._config.shutdown_timeout,
                extra={"event": "stopping", "pod": self._config.pod},
            )
            self._state.notify()  # a start-up retry waiting out its backoff gives up now
            self._state.event("stopping")

    async def backoff(self, seconds: float) -> bool:
        """Wait ``seconds`` before a start-up retry; ``False`` (at once) when stopping.

        Start-up waits for Kafka, Redis or the store as long as they are down;
        a pod told to stop meanwhile must not wait for them to come back.
        """
        with anyio.move_on_after(seconds):
            await self._state.wait(lambda: self._state.stopping)
        return not self._state.stopping

    # -- the operations a way drives -----------------------------------------------

    @contextlib.asynccontextmanager
    async def joined(
        self, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> AsyncIterator[AsyncIterator[Taken]]:
        """Be a member of the group for the block; yield its polls; commit and leave after.

        Each poll is the records the source has room for (``concurrency`` less
        those in flight; the rest are fetched again later), with their
        partitions. The polls end once the source is stopped and its records'
        tasks ended (or the drain time is up). The committer runs beside them;
        at the end it and the tasks that ignored their cancellation are
        cancelled, the partitions' completed prefixes committed, the clients
        closed. Stopped before Kafka ever answered: ``task_status.started()``
        and no polls.
        """
        try:
            if not await self._connect():
                task_status.started()
                yield _no_polls()
                return
            task_status.started()
            async with anyio.create_task_group() as tg:
                self._tasks = tg
                tg.start_soon(self._commits.run, name="leaseworker commits")
                polls = self._polls()
                try:
                    yield polls
                finally:
                    await polls.aclose()
                tg.cancel_scope.cancel()  # the committer, and stragglers that ignored it
            await self._commits.last(list(self._state.partitions.values()))
        finally:
            self._tasks = None
            with anyio.CancelScope(shield=True):
                await self._close()

    def decode(self, record: Any) -> tuple[Trigger | MalformedTrigger, str]:
        """Return the record's trigger and job key, or why it can never become a job."""
        try:
            trigger = decode_trigger(
                topic=record.topic,
                partition=record.partition,
                offset=record.offset,
                key=record.key,
                value=record.value,
                headers=record.headers or (),
                timestamp_ms=record.timestamp,
                max_payload_bytes=self._config.max_payload_bytes,
            )
            return trigger, resolve_job_key(self._resolve_key, trigger)
        except MalformedTrigger as exc:
            return exc, ""

    def start(
        self,
        part: Partition,
        record: Any,
        process: Callable[..., Coroutine[Any, Any, None]],
        *args: Any,
    ) -> None:
        """Count ``record`` in flight and run ``process(*args)`` as its task.

        Inside :meth:`joined` only; a revoke of ``part`` or the shutdown
        deadline cancels this task alone.
        """
        assert self._tasks is not None
        part.tracker.add(record.offset)
        self.stats.in_flight += 1
        # The handle cancels this task alone (revoke, shutdown), like a scope.
        part.tasks[record.offset] = self._tasks.start_soon(process, *args)

    def processing(self, record: Any) -> None:
        """Say that ``record``'s processing begins (first thing in its task)."""
        self._state.event("processing", record=record)

    def received(self, record: Any, trigger: Trigger, job_key: str) -> None:
        """Say that ``record`` became ``trigger`` for ``job_key``, about to run."""
        self._state.event("received", record=record, trigger=trigger, job_key=job_key)

    async def malformed(self, record: Any, exc: MalformedTrigger) -> None:
        """Log a record that can never become a job and copy it to the dead-letter topic."""
        self._dead_letters.malformed(record, exc)
        await self._dead_letters.send(record, exc.reason, exc.detail)

    async def dead_letter(self, record: Any, job_key: str, ending: Ending) -> None:
        """Copy a trigger whose ``ending`` asks for it to the dead-letter topic, naming why."""
        reason = ending.dead_letter
        assert reason is not None
        self.stats.job_failures += 1
        error_type = ending.error_type
        detail = ending.detail or f"the job raised {error_type}"
        failure = None if error_type is None else (error_type, job_key)  # the job never ran
        loss = () if ending.loss_reason is None else (ending.loss_reason,)
        await self._dead_letters.send(record, reason, detail, failure=failure, loss=loss)

    def processed(
        self, part: Partition, record: Any, *, done: bool, error: BaseException | None
    ) -> None:
        """End ``record``'s task: its offset may be committed if ``done`` (a terminal end).

        Last thing in its task (and context, as :meth:`processing`: a hook
        may undo what it set there); ``error`` is what ended the task, if
        anything did (a cancellation included).
        """
        del part.tasks[record.offset]
        self.stats.in_flight -= 1
        if done and not part.gone:
            part.tracker.done(record.offset)
        self.stats.finished += 1
        self._state.notify()
        self._state.event("processed", record=record, error=error)

    # -- the poll loop -------------------------------------------------------------

    async def _polls(self) -> AsyncGenerator[Taken]:
        """Poll until stopped and drained (or drain time is up); yield what each poll handed out."""
        retries = Retries(self._startup)
        while not self._drained():
            if self._login.refused() and not await self._log_in_again():
                return  # stopped while Kafka was away: ``joined`` closes what did start
            if self._all_paused():
                # getmany() would idle for the whole poll timeout: wake up as soon as an
                # execution frees a slot (or, draining, the last one ends) instead.
                with anyio.move_on_after(self._config.poll_timeout):
                    await self._state.wait(self._may_go_on)
                await self._gather()
            self._apply_pauses()
            free = self._config.concurrency - self.stats.in_flight
            wait = 0.0 if self._all_paused() else self._config.poll_timeout
            try:
                with anyio.fail_after(self._config.kafka_timeout):
                    batch = await self._consumer.getmany(
                        timeout_ms=int(wait * 1000), max_records=max(1, free)
                    )
            except (KafkaError, TimeoutError) as exc:
                config = self._config
                refused = refused_error(config.bootstrap_servers, exc, config.kafka_security)
                if refused is not None:  # a missing ACL (Read on the topic): not a matter of time
                    raise refused from exc
                await retries.wait(functools.partial(self._poll_failed, exc))
                continue
            retries.reset()
            self.stats.polls += 1
            self.stats.last_poll_at = anyio.current_time()
            yield self._take(batch, free)  # the way starts their tasks before this goes on
            self._state.event("polled")

    def _take(self, batch: dict[Any, list[Any]], free: int) -> Taken:
        """Return ``batch``'s records to hand out, at most ``free``; give the rest back (seek)."""
        partitions = self._state.partitions
        taken: Taken = []
        for tp, records in batch.items():
            part = partitions.get(tp)
            if part is None and tp in self._consumer.assignment():
                part = partitions[tp] = Partition(tp)
            if part is None or part.revoking or self._state.stopping:
                continue  # not ours any more: the next owner reads from the committed offset
            for record in records:
                if free <= 0:
                    self._consumer.seek(tp, record.offset)  # fetched again once there is room
                    break
                free -= 1
                taken.append((part, record))
        return taken

    async def _gather(self) -> None:
        """Once full, wait (bounded) for more free slots, so that the next poll carries several."""
        if GATHER_WINDOW and self.stats.in_flight and not self._gathered():
            with anyio.move_on_after(GATHER_WINDOW):
                await self._state.wait(self._gathered)

    def _gathered(self) -> bool:
        want = max(1, int(self._config.concurrency * GATHER_SHARE))
        return self._state.stopping or self._config.concurrency - self.stats.in_flight >= want

    async def _connect(self) -> bool:
        """Start the consumer and, with a dead-letter topic, the producer.

        False when the source was stopped before Kafka answered; whatever did
        start is left for :meth:`_close`.
        """
        self._consumer = await self._start(
            "consumer", self._subscribed_consumer, before=self._check_topics
        )
        if self._consumer is None:
            return False
        if self._config.dead_letter_topic:
            self._producer = await self._start("producer", self._new_producer)
            return self._producer is not None
        return True

    async def _log_in_again(self) -> bool:
        """Rebuild the clients with a rotated password after a running one's login was refused.

        The password file holds another password (a rotated Secret): every
        partition is revoked as in a rebalance (executions finish or stop,
        the finished prefix is committed if the old consumer still can), and
        the consumer and dead-letter producer are built and started again with
        it. The same password: if the brokers refuse it, ConfigError (exit 2);
        if they take it, the refusal was another client's and nothing changes.
        False when stopped before the new clients started.
        """
        config = self._config
        if not self._login.rotated():
            refused = KafkaConnectionError("a running client's SASL login was refused")
            await check_refused(
                config.bootstrap_servers,
                refused,
                security=config.kafka_security,
                within=config.kafka_timeout,
            )
            self._login.seen()
            return True
        logger.warning(
            "the Kafka SASL password file holds a new password: reconnecting to Kafka with it",
            extra={"event": "kafka_password_rotated", "pod": config.pod},
        )
        if self._listener is not None:
            await self._listener.on_partitions_revoked(list(self._state.partitions))
        await self._close()
        self._consumer = self._producer = None
        return await self._connect()

    def _poll_failed(self, exc: BaseException, delay: float, attempt: int) -> None:
        logger.warning(
            "polling Kafka failed (%s); retrying in %.1fs",
            describe(exc),
            delay,
            extra={"event": "poll_failed", "pod": self._config.pod},
        )

    def _all_paused(self) -> bool:
        """Whether every partition is paused: at the concurrency limit, or stopping."""
        return self._state.stopping or self.stats.in_flight >= self._config.concurrency

    def _may_go_on(self) -> bool:
        if self._state.stopping:
            return self.stats.in_flight == 0
        return self.stats.in_flight < self._config.concurrency

    def _drained(self) -> bool:
        """Tell whether the loop may end: stopped, and nothing left (or drain time over)."""
        if not self._state.stopping:
            return False
        if self.stats.in_flight == 0:
            return True
        now = anyio.current_time()
        if now >= self._stop_deadline and not self._cancelled_all:
            self._cancelled_all = True
            self.stats.cancelled_on_shutdown = self.stats.in_flight
            logger.warning(
                "shutdown timeout: cancelling %d execution(s)",
                self.stats.in_flight,
                extra={"event": "shutdown_cancel", "pod": self._config.pod},
            )
            for part in self._state.partitions.values():
                part.cancel()
        # Cancelled executions release their leases (shielded, bounded); then give up.
        return now >= self._stop_deadline + release_grace(self._config)

    def _apply_pauses(self) -> None:
        """Pause every assigned partition while full or stopping; resume otherwise."""
        if self._consumer is None:
            return
        before = (self.stats.pauses, self.stats.paused)
        assigned = set(self._consumer.assignment())
        full = self._all_paused()
        want = assigned if full else set()
        paused = set(self._consumer.paused()) & assigned
        if want - paused:
            self._consumer.pause(*(want - paused))
            self.stats.pauses += 1
        if paused - want:
            self._consumer.resume(*(paused - want))
        self.stats.paused = bool(want)
        if (self.stats.pauses, self.stats.paused) != before:
            self._state.event("paused", paused=self.stats.paused)

    # -- clients -------------------------------------------------------------------

    def _subscribed_consumer(self) -> Any:
        """Build a consumer subscribed with the rebalance listener (before it starts)."""
        self._login.built()  # the password this consumer and the producer log in with
        client = self._consumer_factory(self._config, self._topic)
        # The first assignment can arrive before start() returns, and its
        # callback pauses partitions on this very consumer.
        self._consumer = client
        self.stats.membership = "joining"
        self._state.event("joining")
        listener = self._listener = Rebalance(
            self._state, self._config, self._commits, apply_pauses=self._apply_pauses
        )
        client.subscribe([self._topic], listener=listener)
        return client

    async def _check_topics(self) -> None:
        """Raise ConfigError if the job or dead-letter topic does not exist (see ``_topics``)."""
        if self._topic_check is None:
            return
        wanted = [self._topic]
        if self._config.dead_letter_topic:
            wanted.append(self._config.dead_letter_topic)
        await self._topic_check(self._config, wanted)

    def _new_producer(self) -> Any:
        return self._producer_factory(self._config)

    async def _start(
        self,
        what: str,
        make: Callable[[], Any],
        before: Callable[[], Awaitable[None]] | None = None,
    ) -> Any:
        return await _kafka_clients.start(
            what,
            make,
            self._config,
            policy=self._startup,
            backoff=self.backoff,
            before=before,
            waiting=self.waiting_for,
        )

    def waiting_for(self, why: str | None) -> None:
        """Publish what start-up waits for (``None``: nothing) in ``stats.waiting_for``."""
        if self.stats.waiting_for != why:
            self.stats.waiting_for = why
            self._state.event("waiting", reason=why)

    async def _send_commit(self, offsets: dict[Any, int]) -> None:
        await self._consumer.commit(offsets)

    async def _send_dead_letter(self, key: Any, value: bytes | None, headers: Headers) -> None:
        await self._producer.send_and_wait(
            self._config.dead_letter_topic, value=value, key=key, headers=headers
        )

    async def _close(self) -> None:
        for client in (self._consumer, self._producer):
            if client is not None:
                await _kafka_clients.stop(client, self._config)


async def _no_polls() -> AsyncIterator[Taken]:
    """Yield no poll: the polls of a source stopped before Kafka answered."""
    none: tuple[Taken, ...] = ()
    for taken in none:
        yield taken


async def check_topics(settings: SourceSettings, topics: list[str]) -> None:
    """Run :func:`~._topics.require_topics` with the pod's settings (the default check)."""
    await require_topics(
        topics,
        bootstrap_servers=settings.bootstrap_servers,
        security=settings.kafka_security,
        within=settings.kafka_timeout,
        client_id=f"leaseworker-{settings.pod}-topic-check",
        group=settings.group,
    )


__all__ = ["KafkaTriggerSource", "SourceStats", "Taken", "TopicPartition"]
