"""Executions: run one trigger's job under its lease until a terminal outcome.

Each attempt looks the trigger up in the store (the first attempts of a poll's
triggers in one call: :meth:`Executor.prepare`), acquires the lease, claims the
job key with its fence, runs the job inside ``hold()`` and records its result;
``busy`` and ``lost`` are retried with backoff, so a job never runs unfenced.
See docs/design.md#the-executor.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, final

import anyio

from .._backoff import Backoff
from .._errors import ConfigError, LeaseBusy, LeaseUnavailable, StoreUnavailable
from .._events import (
    LOSS_REASONS,
    Attempt,
    EffectEvent,
    Ending,
    ExecutionEvent,
    ExecutionEventName,
    Hook,
    LeaseEvent,
    emit,
    hooks_for,
)
from .._lease import HeldLease, LeaseStore, now
from .._process import ProcessPool
from .._retry import LOST, Retries
from .._store import CompletionResult, CompletionStore, check_text
from ._checks import check_job_class
from ._completion import Completer, completion_key
from ._job import JobContext, ReportJob
from ._lookup import Lookup
from ._trigger import Trigger

logger = logging.getLogger("leaseworker.execution")

LeaseNote = Callable[[Attempt], str]
"""Return the note an attempt's acquisition leaves with the lease (telemetry's trace reference)."""


class _Losses:
    """The lease losses of one trigger's executions so far, against the job's loss budget."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.count = 0

    def charge(self, ending: Ending, *, held: bool = False) -> Ending:
        """Count ``ending`` if it lost a held lease; once the budget is spent, end the trigger.

        ``held``: the execution held its lease and lost something else (the store
        failed inside its block); it counts too.
        """
        if not held and ending.loss_reason not in LOSS_REASONS:  # Redis did not answer
            return ending
        self.count += 1
        if self.count < self.budget:
            return ending
        what = "its lease" if ending.loss_reason else "its store"
        return Ending(
            "lost",
            reason="lost_repeatedly",
            error_type="LeaseLost" if ending.loss_reason else "StoreUnavailable",
            loss_reason=ending.loss_reason,
            detail=f"lost {what} on {self.count} executions in a row "
            f"(loss budget {self.budget}); the last loss: {ending.loss_reason or ending.reason}",
        )


class _Refused(ValueError):
    """Raised when a trigger's input version cannot be stored (``bad_input_version``)."""


@dataclass(frozen=True, slots=True)
class Prepared:
    """A trigger ready for :meth:`Executor.run`: its input version and its share of a lookup.

    ``refused`` is why the input version could not be read (the trigger fails);
    ``lookup`` (``None`` without a store) answers for identity ``index`` of it.
    """

    version: str
    key: str = ""  # the completion key
    refused: Exception | None = None
    lookup: Lookup | None = None
    index: int = 0


class _Unclaimed(Exception):
    """Raised inside the hold when the claim says the job must not run; carries the ending."""

    def __init__(self, ending: Ending) -> None:
        super().__init__(ending.reason or ending.outcome)
        self.ending = ending


@final
class Executor:
    """Run triggers of one job class against one lease store, one trigger per call.

    ::

        executor = Executor(MonthlyReport(), RedisLeases(redis), pod="pod-1",
                            hooks=[LoggingObserver()])
        ending = await executor.run(trigger, "report:acme:2026-11")  # ending.terminal

    Construction checks the job's lease settings (:class:`ConfigError`).
    The caller serialises calls for one job key within a pod; across pods the
    lease does it. With ``store``, completions are recorded (fenced) under
    ``{store_namespace}:{<job key>}`` (the lease namespace: fences are only
    comparable within it); without one, ``run``'s return value is only
    reported to the hooks. ``hooks`` receive every execution and lease event,
    each carrying its :class:`Attempt`; ``lease_note`` gives the note an
    attempt's acquisition leaves with the lease. ``loss_budget`` and
    ``max_result_bytes`` override the job class's attributes of those names
    (``None``: the class's). ``processes`` is the pool ``ctx.run_in_process``
    uses (default: :meth:`ProcessPool.default`).
    """

    def __init__(
        self,
        job: ReportJob,
        leases: LeaseStore,
        *,
        pod: str,
        hooks: Iterable[Hook] = (),
        lost_retry: Backoff = LOST,
        lease_note: LeaseNote | None = None,
        store: CompletionStore | None = None,
        store_namespace: str = "leaseworker",
        loss_budget: int | None = None,
        max_result_bytes: int | None = None,
        processes: ProcessPool | None = None,
    ) -> None:
        check_job_class(type(job))
        if processes is not None and processes.workers:  # none: no child to stop in time
            leases.policy.check_stop_room(processes.stop_allowance)
        self._processes = processes
        self._loss_budget = job.loss_budget if loss_budget is None else loss_budget
        self._max_result_bytes = (
            job.max_result_bytes if max_result_bytes is None else max_result_bytes
        )
        self._job = job
        self._store = store
        self._store_namespace = store_namespace
        self._leases = leases
        self._timing = job.lease_timing(leases.policy)
        self._pod = pod
        hooks = tuple(hooks)
        self._hooks = hooks_for(hooks, ExecutionEvent)
        self._lease_hooks = hooks_for(hooks, LeaseEvent)
        self._effect_hooks = hooks_for(hooks, EffectEvent)
        self._lost_retry = lost_retry
        self._lease_note = lease_note

    def prepare(self, items: Sequence[tuple[Trigger, str]]) -> list[Prepared]:
        """Read each ``(trigger, job key)``'s input version; share one store lookup among them.

        The lookup is made when the first of their executions needs it, so
        every trigger must be handed to :meth:`run` with its ``Prepared``. The
        caller makes sure no other execution of a job key in this pod runs
        between this call and that trigger's run (the pod: first in line).
        """
        prepared: list[Prepared] = []
        for trigger, job_key in items:
            try:
                version = self._input_version(trigger)
            except Exception as exc:  # the trigger fails (and is dead-lettered) in run()
                prepared.append(Prepared("", refused=exc))
                continue
            prepared.append(Prepared(version, key=completion_key(self._store_namespace, job_key)))
        return self._shared(prepared)

    def _shared(self, prepared: list[Prepared]) -> list[Prepared]:
        """Give the triggers of ``prepared`` whose version was read one lookup of them all."""
        readable = [i for i, one in enumerate(prepared) if one.refused is None]
        if self._store is None or not readable:
            return prepared
        lookup = Lookup(self._store, [(prepared[i].key, prepared[i].version) for i in readable])
        shared = list(prepared)
        for index, i in enumerate(readable):
            shared[i] = dataclasses.replace(prepared[i], lookup=lookup, index=index)
        return shared

    async def run(self, trigger: Trigger, job_key: str, prepared: Prepared | None = None) -> Ending:
        """Run executions of ``job_key`` until one reaches a terminal outcome; return it.

        ``prepared``: from :meth:`prepare`; by default the trigger is prepared alone.
        """
        retries = {"busy": Retries(self._job.busy_backoff), "lost": Retries(self._lost_retry)}
        if prepared is None:
            prepared = self.prepare([(trigger, job_key)])[0]
        exc = prepared.refused
        if exc is not None:
            ending = Ending.of_error("failed", exc)
            if isinstance(exc, _Refused):  # not the job's bug: the trigger's data
                ending = Ending("failed", reason="bad_input_version", detail=str(exc))
            self._finished(self._attempt(trigger, job_key, None), now(), ending, error=exc)
            return ending
        losses = _Losses(self._loss_budget)
        while True:
            attempt = self._attempt(trigger, job_key, prepared.version)
            ending = await self._look_up(attempt, losses, prepared)
            if ending.terminal:
                return ending
            prepared = self._shared([prepared])[0]  # a retry looks up again, alone
            kind = "busy" if ending.outcome == "busy" else "lost"

            def retrying(
                delay: float, _: int, attempt: Attempt = attempt, ending: Ending = ending
            ) -> None:
                self._emit(
                    "retry", attempt, outcome=ending.outcome, reason=ending.reason, retry_in=delay
                )

            await retries[kind].wait(retrying, hint=ending.retry_after)

    def _attempt(self, trigger: Trigger, job_key: str, version: str | None) -> Attempt:
        return Attempt(
            trigger=trigger,
            job_key=job_key,
            input_version=version,
            execution_id=uuid.uuid4().hex,
            pod=self._pod,
        )

    def _input_version(self, trigger: Trigger) -> str:
        """Return the trigger's input version; raise if no completion store could keep it.

        The payload's ``inputVersion`` comes from JSON, which lets NUL and lone
        surrogates through: such a trigger fails here (and is dead-lettered)
        instead of failing every store call on the way.
        """
        version = self._job.input_version(trigger)
        if not isinstance(version, str):
            raise _Refused(f"input_version() returned a {type(version).__name__}, not a str")
        try:
            check_text("input version", version, empty_ok=True)
        except ConfigError as exc:  # the trigger's data, not the pod's configuration
            raise _Refused(str(exc)) from None
        return version

    async def _look_up(self, attempt: Attempt, losses: _Losses, prepared: Prepared) -> Ending:
        """Answer from the store if the identity completed, else run one execution."""
        if prepared.lookup is not None:
            begun = now()
            try:
                earlier = await prepared.lookup.answer(prepared.index)
            except StoreUnavailable as exc:
                # Not knowing is not a reason to run: back off as for an unconfirmed lease.
                self._warn("%s; job %r waits for it", exc, attempt, event="store_unavailable")
                return Ending("lost", reason="store_unavailable")
            if earlier is not None:
                ending = Ending("duplicate")
                self._finished(attempt, begun, ending)
                return ending
        return await self._execute(attempt, losses)

    def _key(self, attempt: Attempt) -> str:
        return completion_key(self._store_namespace, attempt.job_key)

    async def _execute(self, attempt: Attempt, losses: _Losses) -> Ending:
        """One execution: how it ended (when busy, with the holder's remaining TTL)."""
        held = HeldLease(  # hold(), with the timing resolved once in __init__
            self._leases,
            attempt.job_key,
            timing=self._timing,
            release_timeout=self._leases.policy.command_timeout,
            hooks=self._lease_hooks,
            lease_note=self._note(attempt),
            attempt=attempt,
            loss_log_level=logging.DEBUG,  # the ``finished`` record warns of the loss
            processes=self._processes,
        )
        begun = now()
        result: object = None
        completer = self._completer(held, attempt)
        error: BaseException | None = None
        self._emit("acquiring", attempt)
        try:
            async with held:
                self._emit("started", attempt, now() - begun, fence=held.fence)
                await self._claim(attempt, held.fence)
                ctx = JobContext(
                    held=held,
                    job_key=attempt.job_key,
                    execution_id=attempt.execution_id,
                    pod=self._pod,
                    trigger=attempt.trigger,
                    completer=completer,
                )
                result = await self._job.run(ctx)
                if completer is not None and not completer.called:
                    await completer.complete(result)  # still under the lease
            ending = Ending("completed")
        except LeaseBusy as exc:
            ending = Ending("busy", retry_after=exc.retry_after)
        except LeaseUnavailable as exc:
            # The acquire got no answer: nothing ran, ownership was never confirmed.
            ending, error = Ending("lost"), exc
        except anyio.get_cancelled_exc_class():
            self._finished(attempt, begun, Ending("cancelled"), held=held)
            raise
        except _Unclaimed as exc:  # the job did not run
            ending = exc.ending
        except Exception as exc:
            error = exc
            if isinstance(exc, StoreUnavailable) and held.outcome == "failed":
                # The store failed inside the block or at its commit, not the job: the
                # trigger is retried, and a commit that did land answers ``duplicate``.
                ending = losses.charge(Ending("lost", reason="store_unavailable"), held=True)
            else:
                outcome = held.outcome or "failed"
                ending = losses.charge(Ending.of_error(outcome, exc, held.loss_reason))
        if completer is not None and completer.result is not None:
            # The store answered: its durable answer decides, whatever happened after.
            ending = self._judged(attempt, completer, completer.result)
        self._finished(attempt, begun, ending, held=held, error=error, result=result)
        return ending

    async def _claim(self, attempt: Attempt, fence: int) -> None:
        """Show this execution's fence to the store before the job runs; raise if it must not.

        Until the store has seen the new fence, a former holder paused past its
        lease could still complete, and win. The claim makes every lower fence
        ``stale`` from now on, whether or not this execution ever completes.
        """
        if self._store is None:
            return
        try:
            answer = await self._store.claim(self._key(attempt), _version(attempt), fence)
        except StoreUnavailable as exc:
            self._warn(
                "%s; job %r does not start unfenced, retried",
                exc,
                attempt,
                event="claim_unavailable",
            )
            raise _Unclaimed(Ending("lost", reason="store_unavailable")) from exc
        if answer.status == "duplicate":
            raise _Unclaimed(Ending("duplicate"))
        if answer.status == "stale":
            self._warn_stale("claim", attempt, fence, answer.highest_fence, "highest")
            raise _Unclaimed(Ending("lost", reason="stale"))

    def _completer(self, held: HeldLease, attempt: Attempt) -> Completer | None:
        if self._store is None:
            return None
        return Completer(
            self._store,
            held,
            key=self._key(attempt),
            input_version=_version(attempt),
            execution_id=attempt.execution_id,
            pod=self._pod,
            max_result_bytes=self._max_result_bytes,
            attempt=attempt,
            hooks=self._effect_hooks,
        )

    def _judged(self, attempt: Attempt, completer: Completer, answer: CompletionResult) -> Ending:
        """Report the store's answer (a ``completion`` event) and map it onto an ending."""
        self._emit(
            "completion",
            attempt,
            completer.elapsed,
            fence=answer.fence,
            reason=answer.status,
            answered_at=completer.answered_at,
        )
        if completer.own(answer):
            return Ending("completed")
        if answer.status == "duplicate":
            return Ending("duplicate")
        self._warn_stale("completion", attempt, answer.fence, answer.winning_fence, "winning")
        return Ending("lost", reason="stale")

    def _finished(
        self,
        attempt: Attempt,
        begun: float,
        ending: Ending,
        *,
        held: HeldLease | None = None,
        error: BaseException | None = None,
        result: object = None,
    ) -> None:
        used = held if held is not None and held.process_calls else None  # children ran
        self._emit(
            "finished",
            attempt,
            now() - begun,
            outcome=ending.outcome,
            reason=ending.reason,
            fence=None if held is None else _fence_of(held),
            error=error,
            result=result,
            cpu_seconds=None if used is None else used.cpu_seconds,
            peak_memory=None if used is None else used.peak_memory,
        )

    def _emit(
        self,
        name: ExecutionEventName,
        attempt: Attempt,
        elapsed: float = 0.0,
        **fields: Any,
    ) -> None:
        if self._hooks:
            event = ExecutionEvent(event=name, attempt=attempt, elapsed=elapsed, **fields)
            emit(self._hooks, event)

    def _note(self, attempt: Attempt) -> Callable[[], str] | None:
        """Return this attempt's lease note, if there is a note maker (telemetry)."""
        note = self._lease_note
        if note is None:
            return None
        return lambda: note(attempt)

    def _warn(self, text: str, exc: BaseException, attempt: Attempt, *, event: str) -> None:
        logger.warning(text, exc, attempt.job_key, extra=_fields(attempt, event))

    def _warn_stale(
        self, what: str, attempt: Attempt, fence: int, winning: int | None, which: str
    ) -> None:
        logger.warning(
            "%s of %r refused as stale: fence %d < %s fence %s; not retried",
            what,
            attempt.job_key,
            fence,
            which,
            winning,
            extra={**_fields(attempt, f"{what}_stale"), "fence": fence, "winningFence": winning},
        )


def _fields(attempt: Attempt, event: str) -> dict[str, object]:
    return {
        "event": event,
        "jobId": attempt.job_key,
        "executionId": attempt.execution_id,
        "pod": attempt.pod,
    }


def _version(attempt: Attempt) -> str:
    assert attempt.input_version is not None  # read before any attempt that runs
    return attempt.input_version


def _fence_of(held: HeldLease) -> int | None:
    """Return the execution's fence, or ``None`` when it never acquired the lease."""
    try:
        return held.fence
    except RuntimeError:
        return None
