"""``ReportJob``, the class users subclass, and ``JobContext``, what ``run`` receives.

A job says which topic triggers it, how long its lease lasts and how to find
the job key (and the input version) in a trigger; ``run(ctx)`` does the work.
The context is a thin, read-mostly view of the held lease: ``ctx.checkpoint()``
is where a long job learns, at a moment of its choosing, that ownership became
uncertain, and ``ctx.complete(result)`` records the result through the fenced
completion store (see ``_completion``).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable
from typing import ClassVar, Concatenate, ParamSpec, TypeVar, final

from .._backoff import Backoff
from .._deprecated import renamed
from .._errors import ConfigError
from .._lease import DeadlinePolicy, HeldLease, LeaseTiming
from .._process import ProcessContext
from .._retry import BUSY
from .._store import CompletionResult, trace_of
from ._completion import Completer, default_input_version
from ._result_checks import DEFAULT_MAX_RESULT_BYTES
from ._transaction import Headers, Transaction
from ._trigger import Trigger, default_job_key

_P = ParamSpec("_P")
_T = TypeVar("_T")


class ReportJob(abc.ABC):
    """A long job run once per trigger, only while its lease is certainly held.

    ::

        class MonthlyReport(ReportJob):
            topic = "reports.requested"
            lease_duration = 30          # seconds; renewed every lease_duration / 3
            max_runtime = 1800           # stop even while the lease is healthy

            async def run(self, ctx: JobContext) -> object:
                for batch in plan(ctx.trigger.payload):
                    await ctx.checkpoint()               # LeaseLost once ownership is uncertain
                    await store.write(batch, fence=ctx.fence)
                return {"rows": total}

    ``job_key(trigger)`` defaults to the record key, else the payload's
    ``jobId``; override it to derive keys such as ``report:{tenant}:{period}``
    (raise :class:`~leaseworker.MalformedTrigger` for triggers that name no
    job). The worker makes one instance and calls ``run`` concurrently for
    different job keys, so keep per-run state in locals, not on ``self``.
    """

    topic: ClassVar[str] = ""
    lease_duration: ClassVar[float] = 30.0
    renewal_interval: ClassVar[float | None] = None
    max_runtime: ClassVar[float | None] = None
    busy_backoff: ClassVar[Backoff] = BUSY
    loss_budget: ClassVar[int] = 5
    """Executions of one trigger that may lose their lease in a row before it is given up.

    Each loss is retried with backoff; once the budget is spent the trigger is
    dead-lettered (``lost_repeatedly``) and committed, so a job that outlives
    its lease on every attempt cannot stall its partition. ``--loss-budget``
    (``PodConfig.loss_budget``) overrides it.
    """
    max_result_bytes: ClassVar[int] = DEFAULT_MAX_RESULT_BYTES
    """The largest result (compact JSON) the store is given; larger ones are ``bad_result``.

    ``--max-result-bytes`` (``PodConfig.max_result_bytes``) overrides it.
    """

    def __init_subclass__(cls, **kwargs: object) -> None:
        """Map the deprecated ``busy_policy`` class attribute onto ``busy_backoff``."""
        super().__init_subclass__(**kwargs)
        if "busy_policy" in vars(cls):
            renamed(f"{cls.__qualname__}.busy_policy", "busy_backoff", stacklevel=4)  # past ABCMeta
            cls.busy_backoff = vars(cls)["busy_policy"]

    def job_key(self, trigger: Trigger) -> str:
        """Return the job key of ``trigger``: its record key, else payload ``jobId``."""
        return default_job_key(trigger)

    def input_version(self, trigger: Trigger) -> str:
        """Return the version of the inputs ``trigger`` asks this job to report on.

        With the job key it is the *completion identity*: a trigger whose
        identity already completed is answered ``duplicate`` without running.
        Default: the payload's string ``inputVersion``, else ``sha256:`` of the
        canonical JSON payload (sorted keys, no whitespace), so a redelivered
        record is a duplicate and a request with different inputs is a new
        report. Override it when only some fields matter (drop a request id,
        say) or the inputs carry their own version (a snapshot id).
        """
        return default_input_version(trigger)

    @abc.abstractmethod
    async def run(self, ctx: JobContext) -> object:
        """Do the work for ``ctx.job_key``; the return value is the job's result."""

    @classmethod
    def lease_timing(cls, policy: DeadlinePolicy) -> LeaseTiming:
        """Check the class's settings and return its lease timing (or raise ConfigError)."""
        check_topic_and_busy_backoff(cls)
        try:
            return LeaseTiming.resolve(
                lease_duration=cls.lease_duration,
                renewal_interval=cls.renewal_interval,
                max_runtime=cls.max_runtime,
                policy=policy,
            )
        except ConfigError as exc:  # name the class: its attributes are what to fix
            raise ConfigError(f"{cls.__qualname__}: {exc}") from None


def check_topic_and_busy_backoff(cls: type[ReportJob]) -> None:
    """Raise :class:`ConfigError` naming the class unless it names a topic and a Backoff."""
    if not isinstance(cls.topic, str) or not cls.topic:
        raise ConfigError(f"{cls.__qualname__}.topic must name a Kafka topic")
    if not isinstance(cls.busy_backoff, Backoff):
        raise ConfigError(f"{cls.__qualname__}.busy_backoff must be a Backoff")


@final
class JobContext:
    """What one execution of a job knows about itself, passed to ``ReportJob.run``.

    ``fence`` goes with every write to a destination that rejects older
    fences (one that records the highest fence it has *seen*, and is shown
    this one before the job's first effect; see docs/completion.md);
    ``owned``/``remaining()`` tell whether ownership is still certain;
    ``await checkpoint()`` raises :class:`~leaseworker.LeaseLost` once it is
    not (the job is also cancelled at its next await anyway). ``await
    complete(result)`` records the result through the worker's completion store.
    """

    __slots__ = ("_completer", "_held", "execution_id", "job_key", "pod", "trigger")

    def __init__(
        self,
        *,
        held: HeldLease,
        job_key: str,
        execution_id: str,
        pod: str,
        trigger: Trigger,
        completer: Completer | None = None,
    ) -> None:
        self._held = held
        self._completer = completer
        if completer is not None:  # its messages carry the trigger's trace context
            completer.trace = trace_of(trigger.headers)
        self.job_key = job_key
        self.execution_id = execution_id
        self.pod = pod
        self.trigger = trigger

    @property
    def fence(self) -> int:
        """Return the fencing token of this execution; strictly increasing per acquisition.

        The completion store has seen it before ``run`` starts (the claim): from
        then on it refuses lower fences. A destination of the job's own must do
        the same: record the highest fence it has seen, from a claim at the
        start as well as from writes, and refuse writes below it.
        """
        return self._held.fence

    @property
    def owned(self) -> bool:
        """Whether this execution still certainly owns the lease."""
        return self._held.owned

    def remaining(self) -> float:
        """Seconds of certain ownership left (0 once uncertain)."""
        return self._held.remaining()

    async def checkpoint(self) -> None:
        """Raise :class:`~leaseworker.LeaseLost` if ownership is uncertain, else yield."""
        await self._held.checkpoint()

    async def run_in_process(
        self,
        fn: Callable[Concatenate[ProcessContext, _P], _T],
        /,
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> _T:
        """Run ``fn(pctx, *args, **kwargs)`` in one of the pod's child processes; return its result.

        For the job's work that never awaits (a CPU loop, pandas, a
        synchronous driver): ``fn`` is an importable function, its arguments
        and result picklable, ``pctx`` a :class:`~leaseworker.ProcessContext`
        (``owned``, ``remaining()``, ``checkpoint()``, read from memory shared
        with the pod). The child's whole process group is killed as soon as
        ownership becomes uncertain, before the lease can go elsewhere; the
        job's async parts (its transaction, its messages) stay in the pod.
        See docs/leases.md.
        """
        return await self._held.run_in_process(fn, *args, **kwargs)

    async def complete(self, result: object) -> CompletionResult:
        """Record ``result`` (JSON-serialisable) as this execution's effect, fenced.

        One transaction stores the completion identity (job key + input
        version), this execution's fence and ``result``. The answer's
        ``status`` is ``accepted``, ``duplicate`` (this identity completed
        before: ``answer.result`` is the earlier result) or ``stale`` (a newer
        fence completed this job key: this execution's work is superseded and
        not retried). A loss the worker already detected raises
        :class:`~leaseworker.LeaseLost` instead of writing; a loss it could not
        see (a pause) is refused by the store as ``stale``. While the store is
        unavailable the call is retried with backoff as long as the lease is
        held. A result no store keeps (not JSON, a non-string key, over
        ``max_result_bytes``) raises :class:`~leaseworker.BadResult` before the
        store is called (that call does not count). Call it once; a job that
        returns without calling it is completed with ``run()``'s return value.
        """
        if self._completer is None:
            raise RuntimeError(
                "this JobContext has no completion store: complete() works in executions "
                "the worker (or an Executor with a store) runs"
            )
        return await self._completer.complete(result)

    def transaction(self) -> contextlib.AbstractAsyncContextManager[Transaction]:
        """Open one transaction in the completion store's database for this execution's effects.

        ``async with ctx.transaction() as tx:`` holds the job key's head lock
        from its start; if the store has seen a fence above ``ctx.fence``
        (claims included) it raises :class:`~leaseworker.effects.TransactionRefused`
        and nothing is written (the execution ends ``lost``, ``stale``). Run the
        job's statements with ``await tx.execute(sql, params)``, add messages
        with ``tx.publish(...)``, name the result with ``tx.complete(result)``:
        when the block ends, the completion is recorded in the same
        transaction, so rows, messages and completion commit together or not
        at all. It counts as the execution's one completion. See docs/effects.md.
        """
        return self._require_completer().transaction()

    def publish(
        self,
        topic: str,
        value: object,
        *,
        key: str | bytes | None = None,
        headers: Headers | None = None,
    ) -> str:
        """Add a message to the outbox, in the completion's transaction; return its effect id.

        ``value``: bytes, ``str`` (UTF-8) or JSON. The message is committed with
        this execution's completion (``ctx.complete``, ``run()``'s return value
        or ``ctx.transaction()``), and not at all if it is refused; a relay then
        sends it to Kafka with the headers ``leaseworker-effect-id``,
        ``leaseworker-job-key`` and ``leaseworker-fence``.
        """
        return self._require_completer().publish(topic, value, key=key, headers=headers)

    def _require_completer(self) -> Completer:
        if self._completer is None:
            raise RuntimeError(
                "this JobContext has no completion store: effects work in executions "
                "the worker (or an Executor with a store) runs"
            )
        return self._completer

    def __repr__(self) -> str:
        return (
            f"JobContext(job_key={self.job_key!r}, execution_id={self.execution_id!r}, "
            f"pod={self.pod!r}, fence={self.fence})"
        )
