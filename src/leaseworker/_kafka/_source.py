"""Triggers from Kafka: one consumer-group member, manual commits, dead letters.

The poll loop never stops polling while jobs run (that is what keeps the pod
in the group however long a job takes: aiokafka leaves the group only when
``getmany`` is not called for ``max_poll_interval``); instead it pauses every
assigned partition while the pod is at its concurrency limit, and re-applies
that after each assignment, because aiokafka keeps pause flags per assignment
and forgets them on a rebalance.

Offsets: each record handed to an execution is tracked per partition
(:class:`OffsetTracker`); a position is committed with ``commit({tp: offset +
1})`` only once every record before it reached a terminal outcome, by a
committer task beside the poll loop (one commit in flight, the next one takes
everything that completed meanwhile). A rebalance awaits
:meth:`KafkaTriggerSource._revoke`: executions of revoked partitions get
``revoke_timeout`` to finish, the rest are cancelled (their leases released),
the completed prefix is committed, and only then are the partitions given up.
A commit rejected after a rebalance (``CommitFailedError``/``IllegalStateError``)
means the partition now belongs to someone else: it is recorded and logged,
never a crash; the new owner re-reads from the last committed offset, and the
lease keeps it from starting a job whose old execution still holds a valid
lease.

aiokafka ships no type information, hence the ``type: ignore`` on its imports.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, final

import anyio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # type: ignore[import-untyped]
from aiokafka.abc import ConsumerRebalanceListener  # type: ignore[import-untyped]
from aiokafka.errors import (  # type: ignore[import-untyped]
    CommitFailedError,
    IllegalStateError,
    KafkaError,
    MessageSizeTooLargeError,
)

from .._backoff import BusyPolicy
from .._errors import MalformedTrigger
from .._execution import Trigger, check_job_key, decode_trigger
from .._telemetry import PodTelemetry, Telemetry
from ._offsets import OffsetTracker
from ._settings import SourceSettings

logger = logging.getLogger("leaseworker.kafka")


@dataclass(frozen=True, slots=True)
class JobFailure:
    """A trigger whose job ended ``failed`` or ``timed_out``: terminal, and dead-lettered.

    ``reason`` is ``job_failed`` or ``job_timed_out``; ``error_type`` is the
    exception's class name. The exception's message is deliberately not
    carried: it may quote payload data.
    """

    reason: str
    error_type: str
    job_key: str


Handle = Callable[[Trigger, str], Awaitable[bool | JobFailure]]
"""Run a trigger's job; ``True`` once terminal, ``False`` if not, a failure to dead-letter."""

ResolveKey = Callable[[Trigger], str]
"""Return a trigger's job key (``ReportJob.job_key``)."""

DEAD_LETTER_HEADERS = (
    "leaseworker.error",
    "leaseworker.error.detail",
    "leaseworker.original.topic",
    "leaseworker.original.partition",
    "leaseworker.original.offset",
    "leaseworker.pod",
)
"""Headers added to a dead-lettered record, after the original record's own headers."""

DEAD_LETTER_FAILURE_HEADERS = ("leaseworker.error.type", "leaseworker.job.key")
"""Headers added after :data:`DEAD_LETTER_HEADERS` when the job failed or timed out."""

DEAD_LETTER_OMITTED = "leaseworker.omitted"
"""Header of a dead letter too large to send whole: what was left out (``value``, ``headers``)."""


@dataclass(slots=True)
class SourceStats:
    """Counters of one source, for tests and operators (read-only outside the source).

    ``membership`` is the consumer's place in its group, for readiness:
    ``starting``, ``joining`` (client started, no assignment yet),
    ``assigned`` or ``idle`` (joined, with or without partitions),
    ``rebalancing`` (partitions revoked, waiting for the next assignment) or
    ``stopping``. ``last_poll_at`` is the monotonic time of the last successful
    poll. Both are replaced by single assignments, so another thread (the
    health server) may read them. ``finished`` counts records whose processing
    ended (terminal or not); ``commit_checked`` is what ``finished`` was when the
    committer last looked for something to commit: once it has caught up, a
    commit that should not happen would have happened.
    """

    polls: int = 0
    assignments: int = 0
    revocations: int = 0
    commits: int = 0
    commit_errors: int = 0
    ownership_losses: int = 0
    dead_letters: int = 0
    job_failures: int = 0
    malformed: int = 0
    pauses: int = 0
    paused: bool = False
    in_flight: int = 0
    finished: int = 0
    commit_checked: int = 0
    cancelled_on_revoke: int = 0
    cancelled_on_shutdown: int = 0
    membership: str = "starting"
    assigned_partitions: int = 0
    last_poll_at: float | None = None


@dataclass(eq=False)
class _Partition:
    """What this pod knows about one assigned partition, for one assignment."""

    tp: Any  # aiokafka TopicPartition
    tracker: OffsetTracker = field(default_factory=OffsetTracker)
    tasks: dict[int, anyio.TaskHandle[None]] = field(default_factory=dict)  # in flight, by offset
    revoking: bool = False
    gone: bool = False  # revoked or its commit was rejected: results no longer count here


@final
class KafkaTriggerSource:
    """Feed one topic's triggers to ``handle`` and commit what reached an end.

    ``resolve_key`` maps a decoded trigger to its job key; ``handle`` runs it
    and returns whether the outcome is terminal. Records that cannot become a
    job, and triggers whose job ended ``failed`` or ``timed_out``, go to
    ``config.dead_letter_topic`` (when set), are logged and committed.
    ``run()`` returns after :meth:`stop` once in-flight work has finished or
    was cancelled at ``config.shutdown_timeout``.
    """

    def __init__(
        self,
        config: SourceSettings,
        *,
        topic: str,
        resolve_key: ResolveKey,
        handle: Handle,
        telemetry: PodTelemetry | None = None,
    ) -> None:
        self._config = config
        self._topic = topic
        self._resolve_key = resolve_key
        self._handle = handle
        self._telemetry = telemetry or Telemetry().instrument(pod=config.pod, group=config.group)
        self._partitions: dict[Any, _Partition] = {}
        self._consumer: Any = None
        self._producer: Any = None
        self._stopping = False
        self._stop_deadline = 0.0
        self._cancelled_all = False
        self._progress = anyio.Event()
        self._commit_lock = anyio.Lock()
        self._startup = BusyPolicy(initial=0.5, cap=config.startup_retry_cap)
        self.stats = SourceStats()

    def stop(self) -> None:
        """Stop fetching; in-flight executions get ``shutdown_timeout`` to finish."""
        if not self._stopping:
            self._stopping = True
            self.stats.membership = "stopping"
            self._stop_deadline = anyio.current_time() + self._config.shutdown_timeout
            logger.info(
                "stopping: no new triggers; %d in flight get %.1fs to finish",
                self.stats.in_flight,
                self._config.shutdown_timeout,
                extra={"event": "stopping", "pod": self._config.pod},
            )
            self._notify()  # a start-up retry waiting out its backoff gives up now

    async def backoff(self, seconds: float) -> bool:
        """Wait ``seconds`` before a start-up retry; ``False`` (at once) when stopping.

        Start-up waits for Kafka, Redis or the store as long as they are down;
        a pod told to stop meanwhile must not wait for them to come back.
        """
        with anyio.move_on_after(seconds):
            await self._wait(lambda: self._stopping)
        return not self._stopping

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Consume until stopped; commit what completed; leave the group.

        Stopped before Kafka ever answered, it reports itself started and
        returns at once (a caller's ``tg.start`` must not fail over it).
        """
        self._consumer = await self._start("consumer", self._new_consumer)
        try:
            if self._consumer is None:
                task_status.started()
                return
            if self._config.dead_letter_topic:
                self._producer = await self._start("producer", self._new_producer)
                if self._producer is None:
                    task_status.started()
                    return
            task_status.started()
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._commit_continuously, name="leaseworker commits")
                await self._poll(tg)
                tg.cancel_scope.cancel()  # the committer, and stragglers that ignored it
            await self._commit_last(list(self._partitions.values()))
        finally:
            with anyio.CancelScope(shield=True):
                await self._close()

    # -- the poll loop -------------------------------------------------------------

    async def _poll(self, tg: anyio.abc.TaskGroup) -> None:
        """Poll, dispatch and commit until stopped and drained (or drain time is up)."""
        retry = 0
        while not self._drained():
            if self._all_paused():
                # getmany() would idle for the whole poll timeout: wake up as soon as an
                # execution frees a slot (or, draining, the last one ends) instead.
                with anyio.move_on_after(self._config.poll_timeout):
                    await self._wait(self._may_go_on)
            self._apply_pauses()
            free = self._config.concurrency - self.stats.in_flight
            wait = 0.0 if self._all_paused() else self._config.poll_timeout
            try:
                with anyio.fail_after(self._config.kafka_timeout):
                    batch = await self._consumer.getmany(
                        timeout_ms=int(wait * 1000), max_records=max(1, free)
                    )
            except (KafkaError, TimeoutError) as exc:
                delay = self._startup.delay(retry)
                retry += 1
                logger.warning(
                    "polling Kafka failed (%s); retrying in %.1fs",
                    _describe(exc),
                    delay,
                    extra={"event": "poll_failed", "pod": self._config.pod},
                )
                await anyio.sleep(delay)
                continue
            retry = 0
            self.stats.polls += 1
            self.stats.last_poll_at = anyio.current_time()
            self._dispatch(tg, batch, free)

    def _all_paused(self) -> bool:
        """Whether every partition is paused: at the concurrency limit, or stopping."""
        return self._stopping or self.stats.in_flight >= self._config.concurrency

    def _may_go_on(self) -> bool:
        if self._stopping:
            return self.stats.in_flight == 0
        return self.stats.in_flight < self._config.concurrency

    def _drained(self) -> bool:
        """Tell whether the loop may end: stopped, and nothing left (or drain time over)."""
        if not self._stopping:
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
            for part in self._partitions.values():
                for task in part.tasks.values():
                    task.cancel()
        # Cancelled executions release their leases (shielded, bounded); then give up.
        return now >= self._stop_deadline + self._release_grace()

    def _dispatch(self, tg: anyio.abc.TaskGroup, batch: dict[Any, list[Any]], free: int) -> None:
        """Hand records to executions, at most ``free``; give the rest back with seek()."""
        for tp, records in batch.items():
            part = self._partitions.get(tp)
            if part is None and tp in self._consumer.assignment():
                part = self._partitions[tp] = _Partition(tp)
            if part is None or part.revoking or self._stopping:
                continue  # not ours any more: the next owner reads from the committed offset
            for record in records:
                if free <= 0:
                    self._consumer.seek(tp, record.offset)  # fetched again once there is room
                    break
                free -= 1
                part.tracker.add(record.offset)
                self.stats.in_flight += 1
                # The handle cancels this task alone (revoke, shutdown), like a scope.
                part.tasks[record.offset] = tg.start_soon(self._process, part, record)

    async def _process(self, part: _Partition, record: Any) -> None:
        """Run one record to its end; mark its offset done when the outcome is terminal."""
        done = False
        try:
            if self._telemetry.enabled:
                with self._telemetry.processing(record):
                    done = await self._run_record(record)
            else:
                done = await self._run_record(record)
        finally:
            del part.tasks[record.offset]
            self.stats.in_flight -= 1
            if done and not part.gone:
                part.tracker.done(record.offset)
            self.stats.finished += 1
            self._notify()

    async def _run_record(self, record: Any) -> bool:
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
            job_key = check_job_key(self._job_key(trigger))
        except MalformedTrigger as exc:
            self._log_malformed(record, exc)
            self._telemetry.malformed(record, exc.reason)
            await self._dead_letter(record, exc.reason, exc.detail)
            return True
        self._telemetry.received(trigger, job_key)
        result = await self._handle(trigger, job_key)
        if isinstance(result, JobFailure):
            self.stats.job_failures += 1
            detail = f"the job raised {result.error_type}"
            await self._dead_letter(
                record, result.reason, detail, failure=(result.error_type, result.job_key)
            )
            return True
        return result

    def _job_key(self, trigger: Trigger) -> str:
        try:
            return self._resolve_key(trigger)
        except MalformedTrigger:
            raise
        except Exception as exc:
            raise MalformedTrigger(
                "job_key_error", f"job_key() raised {type(exc).__name__}"
            ) from exc

    def _apply_pauses(self) -> None:
        """Pause every assigned partition while full or stopping; resume otherwise."""
        if self._consumer is None:
            return
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

    # -- commits -------------------------------------------------------------------

    async def _commit_continuously(self) -> None:
        """Commit completed prefixes as they move, beside the poll loop (until cancelled).

        One commit is in flight at a time; whatever completes meanwhile goes
        into the next one, so commits batch themselves under load and the poll
        loop never waits for a commit round trip. A failed commit is retried
        after ``poll_timeout``.
        """
        while True:
            await self._wait(self._committable)
            if not await self._commit(self._active()):
                await anyio.sleep(self._config.poll_timeout)

    def _active(self) -> list[_Partition]:
        return [p for p in self._partitions.values() if not p.revoking]

    def _committable(self) -> bool:
        self.stats.commit_checked = self.stats.finished
        return any(not p.gone and p.tracker.committable() for p in self._active())

    async def _commit_last(self, parts: list[_Partition]) -> None:
        """Commit ``parts`` before they are given up (rebalance, shutdown), retrying.

        There is no later commit for them, so a failure is tried again (a
        coordinator moving, a broker restarting) until ``commit_timeout`` is
        spent in all, the same bound as a single try: what is not committed
        then is delivered again (and answered ``duplicate`` with a store).
        """
        deadline = anyio.current_time() + self._config.commit_timeout
        while not await self._commit(parts, within=deadline - anyio.current_time()):
            left = deadline - anyio.current_time()
            if left <= 0:
                return
            await anyio.sleep(min(self._config.poll_timeout, left))

    async def _commit(self, parts: Iterable[_Partition], *, within: float | None = None) -> bool:
        """Commit each partition's contiguous completed prefix, if it moved.

        Return ``False`` when Kafka failed the commit (it is retried later).
        ``within``: seconds the try may take (default ``commit_timeout``).
        """
        parts = list(parts)
        if not any(not p.gone and p.tracker.committable() for p in parts):
            return True
        # The wait for a commit already in flight counts too: the revoke step's
        # bound (``rebalance_timeout``) has room for one commit_timeout.
        limit = self._config.commit_timeout if within is None else within
        deadline = anyio.current_time() + limit
        with anyio.move_on_after(limit) as waiting:
            await self._commit_lock.acquire()
        if waiting.cancelled_caught:
            return False  # another commit held the lock all along; this one is tried again
        try:
            # What is committable now: the commit waited for may have taken some of it.
            ready = {
                p.tp: (p, pos) for p in parts if not p.gone and (pos := p.tracker.committable())
            }
            if not ready:
                return True
            offsets = {tp: pos for tp, (_, pos) in ready.items()}
            began = anyio.current_time()
            try:
                with anyio.fail_after(deadline - began):
                    await self._consumer.commit(offsets)
            except (CommitFailedError, IllegalStateError) as exc:
                self._telemetry.committed(offsets, began, error=exc, rejected=True)
                self.stats.ownership_losses += 1
                for part, _ in ready.values():
                    part.gone = True
                logger.warning(
                    "commit rejected after a rebalance (%s): partitions %s now belong to "
                    "another member, which re-reads them from the last committed offset",
                    type(exc).__name__,
                    _names(offsets),
                    exc_info=False,
                    extra={"event": "ownership_lost", "pod": self._config.pod},
                )
                return True
            except (KafkaError, TimeoutError) as exc:
                self._telemetry.committed(offsets, began, error=exc)
                self.stats.commit_errors += 1
                logger.warning(
                    "commit failed (%s); will retry",
                    _describe(exc),
                    extra={"event": "commit_failed", "pod": self._config.pod},
                )
                return False
        finally:
            self._commit_lock.release()
        self._telemetry.committed(offsets, began)
        for part, pos in ready.values():
            part.tracker.committed(pos)
        self.stats.commits += 1
        logger.debug(
            "committed %s", _names(offsets), extra={"event": "committed", "pod": self._config.pod}
        )
        return True

    # -- rebalances ----------------------------------------------------------------

    async def _revoke(self, revoked: Iterable[Any]) -> None:
        """Finish or stop the revoked partitions' executions, then commit them.

        Runs inside aiokafka's rebalance (its heartbeat keeps going); the group
        waits for it up to ``config.rebalance_timeout``, which is sized to the
        bounds used here.
        """
        began = anyio.current_time()
        if self.stats.membership in ("assigned", "idle"):
            self.stats.membership = "rebalancing"
        parts = [self._partitions[tp] for tp in revoked if tp in self._partitions]
        if not parts:
            return  # aiokafka calls this with nothing before the first join
        for part in parts:
            part.revoking = True

        def idle() -> bool:
            return not any(part.tasks for part in parts)

        with anyio.move_on_after(self._config.revoke_timeout):
            await self._wait(idle)
        cancelled = sum(len(part.tasks) for part in parts)
        for part in parts:
            for task in part.tasks.values():
                task.cancel()
        with anyio.move_on_after(self._release_grace()):
            await self._wait(idle)
        await self._commit_last(parts)
        for part in parts:
            part.gone = True
            self._telemetry.forget(part.tp.topic, part.tp.partition)
            if self._partitions.get(part.tp) is part:
                del self._partitions[part.tp]
        self.stats.revocations += 1
        self.stats.cancelled_on_revoke += cancelled
        logger.info(
            "partitions revoked: %s; %d execution(s) cancelled after %.1fs, took %.0f ms",
            _names(part.tp for part in parts),
            cancelled,
            self._config.revoke_timeout,
            (anyio.current_time() - began) * 1000,
            extra={"event": "revoked", "pod": self._config.pod},
        )

    def _assign(self, assigned: Iterable[Any]) -> None:
        """Start tracking newly assigned partitions and re-apply pauses."""
        tps = set(assigned)
        for tp in tps:
            if tp not in self._partitions:
                self._partitions[tp] = _Partition(tp)
        self.stats.assignments += 1
        self.stats.assigned_partitions = len(tps)
        if not self._stopping:
            self.stats.membership = "assigned" if tps else "idle"
        self._apply_pauses()
        logger.info(
            "partitions assigned: %s",
            _names(self._partitions),
            extra={"event": "assigned", "pod": self._config.pod},
        )

    # -- dead letters --------------------------------------------------------------

    def _log_malformed(self, record: Any, exc: MalformedTrigger) -> None:
        """Log a malformed record: reason and position, never its contents."""
        self.stats.malformed += 1
        logger.warning(
            "malformed trigger %s[%d]@%d: %s",
            record.topic,
            record.partition,
            record.offset,
            exc,
            extra={
                "event": "malformed",
                "pod": self._config.pod,
                "reason": exc.reason,
                "topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
            },
        )

    async def _dead_letter(
        self, record: Any, reason: str, detail: str, *, failure: tuple[str, str] | None = None
    ) -> None:
        """Copy ``record`` to the dead-letter topic, if one is set (retried until it succeeds).

        ``failure`` is the (error type, job key) of a failed or timed-out job.
        """
        if self._producer is None:
            return
        position = (record.topic, str(record.partition), str(record.offset), self._config.pod)
        added = [
            *zip(DEAD_LETTER_HEADERS, (reason, detail, *position), strict=True),
            *(zip(DEAD_LETTER_FAILURE_HEADERS, failure, strict=True) if failure else ()),
        ]
        # What is sent, most complete first: when the copy is too large for the
        # producer or the topic, the payload, then the original headers are left
        # out (the record itself stays in its topic, at the coordinates above).
        copies = _dead_letter_copies(record, [(name, value.encode()) for name, value in added])
        value, headers, _ = next(copies)
        attempt = 0
        while True:
            try:
                with anyio.fail_after(self._config.kafka_timeout):
                    await self._producer.send_and_wait(
                        self._config.dead_letter_topic, value=value, key=record.key, headers=headers
                    )
            except MessageSizeTooLargeError as err:
                smaller = next(copies, None)
                if smaller is not None:
                    value, headers, omitted = smaller
                    logger.warning(
                        "dead letter of %s[%d]@%d is too large (%s); sending it without its %s",
                        record.topic,
                        record.partition,
                        record.offset,
                        _describe(err),
                        omitted.replace(",", " and "),
                        extra={"event": "dead_letter_trimmed", "pod": self._config.pod},
                    )
                    continue
                await self._dead_letter_retry(record, err, attempt)
                attempt += 1
                continue
            except (KafkaError, TimeoutError) as err:
                await self._dead_letter_retry(record, err, attempt)
                attempt += 1
                continue
            self.stats.dead_letters += 1
            self._telemetry.dead_lettered(record, reason)
            logger.info(
                "dead-lettered %s[%d]@%d: %s",
                record.topic,
                record.partition,
                record.offset,
                reason,
                extra={"event": "dead_lettered", "pod": self._config.pod, "reason": reason},
            )
            return

    async def _dead_letter_retry(self, record: Any, err: BaseException, attempt: int) -> None:
        """Log a failed dead-letter send and wait before the next try.

        A retriable error (the broker is away, a leader moves) is a warning; one
        that only an operator can fix (authorisation, a missing or invalid
        topic) is an error, and is retried too, so the record is never dropped.
        """
        delay = self._startup.delay(attempt)
        retriable = isinstance(err, TimeoutError) or getattr(err, "retriable", False)
        logger.log(
            logging.WARNING if retriable else logging.ERROR,
            "dead-lettering %s[%d]@%d failed (%s); retrying in %.1fs",
            record.topic,
            record.partition,
            record.offset,
            _describe(err),
            delay,
            extra={"event": "dead_letter_failed", "pod": self._config.pod},
        )
        await anyio.sleep(delay)

    # -- clients -------------------------------------------------------------------

    def _new_consumer(self) -> Any:
        config = self._config
        return AIOKafkaConsumer(
            self._topic,
            bootstrap_servers=config.bootstrap_servers,
            group_id=config.group,
            client_id=f"leaseworker-{config.pod}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=_ms(config.session_timeout),
            heartbeat_interval_ms=_ms(config.heartbeat),
            max_poll_interval_ms=_ms(config.max_poll_interval),
            rebalance_timeout_ms=_ms(config.rebalance_timeout),
            request_timeout_ms=_ms(config.kafka_timeout),
            max_poll_records=config.concurrency,
            retry_backoff_ms=200,
            **config.kafka_security.client_kwargs(),
        )

    def _new_producer(self) -> Any:
        return AIOKafkaProducer(
            bootstrap_servers=self._config.bootstrap_servers,
            client_id=f"leaseworker-{self._config.pod}-dead-letters",
            acks="all",
            request_timeout_ms=_ms(self._config.kafka_timeout),
            **self._config.kafka_security.client_kwargs(),
        )

    async def _start(self, what: str, factory: Callable[[], Any]) -> Any:
        """Start a Kafka client, retrying with capped backoff and a log line per failure.

        Returns ``None`` when the source is stopped before the client started.
        """
        attempt = 0
        while True:
            client = factory()
            if what == "consumer":
                # The first assignment can arrive before start() returns, and its
                # callback pauses partitions on this very consumer.
                self._consumer = client
                self.stats.membership = "joining"
                client.subscribe([self._topic], listener=_Listener(self))
            try:
                with anyio.fail_after(self._config.kafka_timeout):
                    await client.start()
            except (KafkaError, OSError, TimeoutError) as exc:
                with (
                    anyio.CancelScope(shield=True),
                    anyio.move_on_after(self._config.kafka_timeout),
                ):
                    await client.stop()
                delay = self._startup.delay(attempt)
                attempt += 1
                logger.warning(
                    "Kafka at %s unavailable for the %s (%s); retrying in %.1fs (attempt %d)",
                    self._config.bootstrap_servers,
                    what,
                    _describe(exc),
                    delay,
                    attempt,
                    extra={"event": "kafka_unavailable", "pod": self._config.pod},
                )
                if not await self.backoff(delay):
                    if what == "consumer":
                        self._consumer = None
                    return None
                continue
            if attempt:
                logger.info(
                    "Kafka %s connected after %d attempt(s)",
                    what,
                    attempt + 1,
                    extra={"event": "kafka_connected", "pod": self._config.pod},
                )
            return client

    async def _close(self) -> None:
        for client in (self._consumer, self._producer):
            if client is not None:
                with anyio.move_on_after(self._config.kafka_timeout):
                    await client.stop()

    # -- helpers -------------------------------------------------------------------

    def _release_grace(self) -> float:
        """How long cancelled executions may take to release their leases."""
        return 2 * self._config.redis_timeout + 0.5

    def _notify(self) -> None:
        self._progress.set()
        self._progress = anyio.Event()

    async def _wait(self, done: Callable[[], bool]) -> None:
        while True:
            progress = self._progress
            if done():
                return
            await progress.wait()


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Forward aiokafka's rebalance callbacks to the source (aiokafka awaits them)."""

    def __init__(self, source: KafkaTriggerSource) -> None:
        self._source = source

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._source._revoke(revoked)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self._source._assign(assigned)


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _names(tps: Iterable[Any]) -> str:
    return ", ".join(sorted(f"{tp.topic}[{tp.partition}]" for tp in tps)) or "none"


_Copy = tuple[bytes | None, list[tuple[str, bytes | None]], str]
"""A dead letter's value, its headers, and what it leaves out of the record (``""``: nothing)."""


def _dead_letter_copies(record: Any, added: list[tuple[str, bytes]]) -> Iterator[_Copy]:
    """Yield the dead-letter copies of ``record``, most complete first.

    The whole record with ``added``; then without its value; then without its
    own headers either. The smaller copies name what they left out in
    :data:`DEAD_LETTER_OMITTED`. A header without a value stays without one.
    """
    own: list[tuple[str, bytes | None]] = list(record.headers or ())
    yield record.value, [*own, *added], ""
    if record.value is not None:
        yield None, [*own, *added, (DEAD_LETTER_OMITTED, b"value")], "value"
    if own:
        omitted = "headers" if record.value is None else "value,headers"
        yield None, [*added, (DEAD_LETTER_OMITTED, omitted.encode())], omitted


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError) and not isinstance(exc, KafkaError):
        return "no answer in time"
    return f"{type(exc).__name__}: {exc}"


__all__ = [
    "DEAD_LETTER_FAILURE_HEADERS",
    "DEAD_LETTER_HEADERS",
    "DEAD_LETTER_OMITTED",
    "JobFailure",
    "KafkaTriggerSource",
    "SourceStats",
    "TopicPartition",
]
