"""Lease timing: the local deadline formula and the settings checks that protect it.

``local_deadline = t_sent + ttl * (1 - drift) - margin``, with ``t_sent`` read
from the loop's monotonic clock before the request is written, so Redis cannot
expire the key before it. See docs/design.md#local-deadline.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import anyio

from .._errors import ConfigError


def now() -> float:
    """Read the event loop's monotonic clock, the one every lease deadline is on.

    It is the clock ``anyio.current_time()`` reads on asyncio (leaseworker runs
    on asyncio: redis.asyncio and aiokafka pin it), minus anyio's backend
    lookup, which cost a few microseconds on every call of the per-trigger path.
    Without a running asyncio loop it asks anyio.
    """
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return anyio.current_time()


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadlinePolicy:
    """How conservatively a client turns a TTL into a local deadline.

    ``command_timeout`` bounds every Redis call made for a lease.
    """

    drift: float = 0.01
    margin: float = 0.05
    command_timeout: float = 0.5

    def __post_init__(self) -> None:
        if not 0 <= self.drift < 0.5:
            raise ConfigError(f"drift must be in [0, 0.5), got {self.drift}")
        if self.margin < 0:
            raise ConfigError(f"margin must be >= 0 seconds, got {self.margin}")
        if self.command_timeout <= 0:
            raise ConfigError(f"command_timeout must be > 0 seconds, got {self.command_timeout}")

    def validity(self, ttl: float) -> float:
        """Seconds of trusted ownership a request sent now buys for ``ttl``."""
        return ttl * (1 - self.drift) - self.margin

    def local_deadline(self, sent_at: float, ttl: float) -> float:
        """Return the monotonic time after which ownership is uncertain."""
        return sent_at + self.validity(ttl)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseTiming:
    """Validated timing of one held lease: TTL, renewal cadence, runtime bound.

    Build it with :meth:`resolve`, which fills the default renewal interval
    (``ttl / 3``) and raises :class:`ConfigError` for settings that could not
    keep the lease alive on a healthy Redis::

        timing = LeaseTiming.resolve(ttl=30, renew_every=None, max_runtime=600,
                                     policy=DeadlinePolicy())
    """

    ttl: float
    renew_every: float
    max_runtime: float | None

    @classmethod
    def resolve(
        cls,
        *,
        ttl: float,
        renew_every: float | None,
        max_runtime: float | None,
        policy: DeadlinePolicy,
    ) -> LeaseTiming:
        """Check the settings against ``policy`` and return the resolved timing.

        The rules: the TTL must leave a positive validity after drift and
        margin; the renewal interval must be shorter than the TTL; and a renewal
        sent on schedule must be answered or time out (``command_timeout``)
        before the local deadline, or a healthy but slow Redis would make every
        long job lose its lease.
        """
        if ttl <= 0:
            raise ConfigError(f"ttl must be > 0 seconds, got {ttl}")
        validity = policy.validity(ttl)
        if validity <= 0:
            raise ConfigError(
                f"ttl={ttl}s leaves no validity after drift={policy.drift} and "
                f"margin={policy.margin}s; use a longer ttl"
            )
        every = ttl / 3 if renew_every is None else renew_every
        if every <= 0:
            raise ConfigError(f"renew_every must be > 0 seconds, got {every}")
        if every >= ttl:
            raise ConfigError(f"renew_every={every}s must be shorter than ttl={ttl}s")
        if every + policy.command_timeout >= validity:
            raise ConfigError(
                f"renew_every={every}s plus command_timeout={policy.command_timeout}s "
                f"must end before the local deadline ({validity:.3f}s after each renewal "
                f"is sent, from ttl={ttl}s, drift={policy.drift}, margin={policy.margin}s); "
                "renew more often or use a longer ttl"
            )
        if max_runtime is not None and max_runtime <= 0:
            raise ConfigError(f"max_runtime must be > 0 seconds, got {max_runtime}")
        return cls(ttl=ttl, renew_every=every, max_runtime=max_runtime)
