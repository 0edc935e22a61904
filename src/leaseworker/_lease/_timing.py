"""Lease timing: the local deadline formula and the settings checks that protect it.

``local_deadline = t_sent + lease_duration * (1 - drift) - margin``, with ``t_sent`` read
from the loop's monotonic clock before the request is written, so Redis cannot
expire the key before it. See docs/design.md#local-deadline.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import anyio

from .._deprecated import renamed
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
    """How conservatively a client turns a lease duration into a local deadline.

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

    def validity(self, lease_duration: float) -> float:
        """Seconds of trusted ownership a request sent now buys for ``lease_duration``."""
        return lease_duration * (1 - self.drift) - self.margin

    def local_deadline(self, sent_at: float, lease_duration: float) -> float:
        """Return the monotonic time after which ownership is uncertain."""
        return sent_at + self.validity(lease_duration)

    def check_stop_room(self, stop_allowance: float) -> None:
        """Raise :class:`ConfigError` unless ``margin`` leaves room to kill a child process.

        A job's child process is killed at the local deadline at the latest
        (by the pod, or by its own watchdog); the kill and the reap must be
        over before Redis can expire the key, which is ``margin`` later at
        the soonest (drift covers clock rates, not this).
        """
        if self.margin < stop_allowance:
            raise ConfigError(
                f"margin={self.margin}s leaves no room to stop a child process before the "
                f"lease can expire (kill and reap take up to {stop_allowance}s); "
                f"use a margin of at least {stop_allowance}s"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseTiming:
    """Validated timing of one held lease: its duration, renewal interval, runtime bound.

    Build it with :meth:`resolve`, which fills the default renewal interval
    (``lease_duration / 3``) and raises :class:`ConfigError` for settings that could not
    keep the lease alive on a healthy Redis::

        timing = LeaseTiming.resolve(lease_duration=30, renewal_interval=None, max_runtime=600,
                                     policy=DeadlinePolicy())
    """

    lease_duration: float
    renewal_interval: float
    max_runtime: float | None

    @property
    def ttl(self) -> float:
        """Deprecated spelling of :attr:`lease_duration`."""
        renamed("LeaseTiming.ttl", "LeaseTiming.lease_duration")
        return self.lease_duration

    @property
    def renew_every(self) -> float:
        """Deprecated spelling of :attr:`renewal_interval`."""
        renamed("LeaseTiming.renew_every", "LeaseTiming.renewal_interval")
        return self.renewal_interval

    @classmethod
    def resolve(
        cls,
        *,
        lease_duration: float,
        renewal_interval: float | None,
        max_runtime: float | None,
        policy: DeadlinePolicy,
    ) -> LeaseTiming:
        """Check the settings against ``policy`` and return the resolved timing.

        The rules: the lease duration must leave a positive validity after drift and
        margin; the renewal interval must be shorter than the duration; and a renewal
        sent on schedule must be answered or time out (``command_timeout``)
        before the local deadline, or a healthy but slow Redis would make every
        long job lose its lease.
        """
        if lease_duration <= 0:
            raise ConfigError(f"lease_duration must be > 0 seconds, got {lease_duration}")
        validity = policy.validity(lease_duration)
        if validity <= 0:
            raise ConfigError(
                f"lease_duration={lease_duration}s leaves no validity after "
                f"drift={policy.drift} and margin={policy.margin}s; use a longer lease_duration"
            )
        every = lease_duration / 3 if renewal_interval is None else renewal_interval
        if every <= 0:
            raise ConfigError(f"renewal_interval must be > 0 seconds, got {every}")
        if every >= lease_duration:
            raise ConfigError(
                f"renewal_interval={every}s must be shorter than lease_duration={lease_duration}s"
            )
        if every + policy.command_timeout >= validity:
            raise ConfigError(
                f"renewal_interval={every}s plus command_timeout={policy.command_timeout}s "
                f"must end before the local deadline ({validity:.3f}s after each renewal "
                f"is sent, from lease_duration={lease_duration}s, drift={policy.drift}, "
                f"margin={policy.margin}s); "
                "renew more often or use a longer lease_duration"
            )
        if max_runtime is not None and max_runtime <= 0:
            raise ConfigError(f"max_runtime must be > 0 seconds, got {max_runtime}")
        return cls(lease_duration=lease_duration, renewal_interval=every, max_runtime=max_runtime)
