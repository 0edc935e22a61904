"""``ReportJob``, the class users subclass, and ``JobContext``, what ``run`` receives.

A job says which topic triggers it, how long its lease lasts and how to find
the job key in a trigger; ``run(ctx)`` does the work. The context is a thin,
read-mostly view of the held lease: ``ctx.checkpoint()`` is where a long job
learns, at a moment of its choosing, that ownership became uncertain.
"""

from __future__ import annotations

import abc
from typing import ClassVar, final

from ._backoff import BusyPolicy
from ._errors import ConfigError
from ._hold import HeldLease
from ._timing import DeadlinePolicy, LeaseTiming
from ._trigger import Trigger, default_job_key


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
    busy_policy: ClassVar[BusyPolicy] = BusyPolicy()

    def job_key(self, trigger: Trigger) -> str:
        """Return the job key of ``trigger``: its record key, else payload ``jobId``."""
        return default_job_key(trigger)

    @abc.abstractmethod
    async def run(self, ctx: JobContext) -> object:
        """Do the work for ``ctx.job_key``; the return value is the job's result."""

    @classmethod
    def lease_timing(cls, policy: DeadlinePolicy) -> LeaseTiming:
        """Check the class's settings and return its lease timing (or raise ConfigError)."""
        if not isinstance(cls.topic, str) or not cls.topic:
            raise ConfigError(f"{cls.__qualname__}.topic must name a Kafka topic")
        if not isinstance(cls.busy_policy, BusyPolicy):
            raise ConfigError(f"{cls.__qualname__}.busy_policy must be a BusyPolicy")
        return LeaseTiming.resolve(
            ttl=cls.lease_duration,
            renew_every=cls.renewal_interval,
            max_runtime=cls.max_runtime,
            policy=policy,
        )


@final
class JobContext:
    """What one execution of a job knows about itself, passed to ``ReportJob.run``.

    ``fence`` goes with every write to a destination that rejects older
    fences; ``owned``/``remaining()`` tell whether ownership is still certain;
    ``await checkpoint()`` raises :class:`~leaseworker.LeaseLost` once it is
    not (the job is also cancelled at its next await anyway).
    """

    __slots__ = ("_held", "execution_id", "job_key", "pod", "trigger")

    def __init__(
        self, *, held: HeldLease, job_key: str, execution_id: str, pod: str, trigger: Trigger
    ) -> None:
        self._held = held
        self.job_key = job_key
        self.execution_id = execution_id
        self.pod = pod
        self.trigger = trigger

    @property
    def fence(self) -> int:
        """Return the fencing token of this execution; strictly increasing per acquisition."""
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

    def __repr__(self) -> str:
        return (
            f"JobContext(job_key={self.job_key!r}, execution_id={self.execution_id!r}, "
            f"pod={self.pod!r}, fence={self.fence})"
        )
