"""The lease as a value and the store protocol: what ``hold()`` needs, with no Redis client.

``RedisLeases`` (``_redis_leases``) and ``leaseworker.testing.MemoryLeases`` implement
:class:`LeaseStore` and share the checks here, so ``import leaseworker`` and
``hold()`` load no redis-py until a Redis lease store is made: redis-py 8.1
imports the OpenTelemetry SDK itself (``redis.observability.providers``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from .._deprecated import keyword, renamed
from .._errors import ConfigError
from ._timing import DeadlinePolicy, now


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    """One acquisition of a job key's lease, as this worker knows it.

    ``local_deadline`` is on the event loop's monotonic clock
    (``anyio.current_time()`` on asyncio); past it, ownership is uncertain. ``sent_at`` is
    when the acquire or last successful renew was sent. ``previous`` is the note
    the acquisition before this one left (see :meth:`RedisLeases.acquire`), if any.
    """

    key: str
    owner: str
    fence: int
    lease_duration: float
    sent_at: float
    local_deadline: float
    previous: str | None = None

    @property
    def expires_at(self) -> float:
        """The earliest moment Redis can expire the key: ``sent_at`` plus the TTL.

        Redis starts the TTL when the request arrives, never before it was sent.
        """
        return self.sent_at + self.lease_duration

    @property
    def ttl(self) -> float:
        """Deprecated spelling of :attr:`lease_duration`."""
        renamed("Lease.ttl", "Lease.lease_duration")
        return self.lease_duration

    def remaining(self) -> float:
        """Seconds of trusted ownership left (0 once the deadline passed)."""
        return max(0.0, self.local_deadline - now())

    def __repr__(self) -> str:
        # The owner token authorises renew/release; keep it out of logs and reprs.
        return f"Lease(key={self.key!r}, fence={self.fence}, lease_duration={self.lease_duration})"


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseInfo:
    """What Redis holds for a job key, for operators (``leaseworker inspect``).

    ``owner`` and ``ttl`` (the time Redis has left on the key) are
    ``None`` when nobody holds the lease; ``fence`` is the last fence handed
    out, ``None`` when the key was never acquired (or Redis lost its data).
    """

    key: str
    owner: str | None
    ttl: float | None
    fence: int | None

    @property
    def holder(self) -> str | None:
        """The owner token with its random part masked: ``"pod-a:***"``.

        The prefix names the holder (a pod's ``--pod`` name, or ``owner_prefix``);
        the random part is the secret that lets renew and release act on the
        lease, so it is what ``leaseworker inspect`` leaves out.
        """
        if self.owner is None:
            return None
        prefix, colon, _ = self.owner.rpartition(":")
        return f"{prefix}{colon}***"


class LeaseStore(Protocol):
    """What ``hold()`` and the worker need from a lease backend."""

    @property
    def policy(self) -> DeadlinePolicy:
        """The deadline policy every lease from this store is computed with."""
        ...

    async def acquire(self, key: str, lease_duration: float, *, note: str = "") -> Lease | None:
        """Take the lease for ``key`` or return ``None`` when someone holds it.

        ``note`` is kept with this acquisition until the next one, which gets it
        as :attr:`Lease.previous` (a store may ignore notes: ``previous`` stays ``None``).
        """
        ...

    async def renew(self, lease: Lease) -> Lease:
        """Extend ``lease`` or raise :class:`LeaseLost`."""
        ...

    async def release(self, lease: Lease) -> bool:
        """Delete the lease if this owner still holds it; say whether it did."""
        ...

    async def inspect(self, key: str) -> LeaseInfo:
        """Read the lease's owner, TTL and last fence."""
        ...


def checked_key(key: str) -> str:
    # The key is the Redis Cluster hash tag ``{<key>}``, which ends at its first
    # ``}``. An empty tag (an empty key, or one starting with ``}``) makes Redis
    # hash the whole key: the lease and fence keys would land on different slots
    # (CROSSSLOT on every call). Any other key gives both the same tag.
    if not key:
        raise ConfigError("job key must be a non-empty string")
    if key.startswith("}"):
        raise ConfigError("job key must not start with '}' (it is a Redis Cluster hash tag)")
    return key


def duration_from_ttl(where: str, ttl: float | None) -> float:
    """Return the lease duration given as the deprecated ``ttl=`` (a ``TypeError`` if none)."""
    value = keyword(where, "ttl", ttl, "lease_duration", None, stacklevel=5)
    if value is None:
        raise TypeError(f"{where} missing required argument: 'lease_duration'")
    return value


def check_lease_duration(lease_duration: float) -> None:
    if lease_duration <= 0.001:
        raise ConfigError(f"lease_duration must be more than 1 ms, got {lease_duration}s")


def ttl_ms(seconds: float) -> str:
    """Return the TTL in whole milliseconds for ``PX``, never shorter than ``seconds``.

    Rounded up: the local deadline is computed from ``seconds`` itself, so a
    key that Redis expired sooner could be taken by another pod while this
    one still counts itself the owner. (Rounded to a nanosecond first, so
    that float noise such as 0.3 * 1000 = 300.00000000000006 is not a
    millisecond more.)
    """
    return str(max(1, math.ceil(round(seconds * 1000, 6))))


def describe_failure(exc: BaseException) -> str:
    """One line for a failed call: our own timeout, or the client's error by type.

    A redis-py error (module ``redis.*``) is named even when it is a timeout,
    told apart by module so that this needs no redis import.
    """
    if isinstance(exc, TimeoutError) and not type(exc).__module__.startswith("redis."):
        return "no answer within command_timeout"
    return f"{type(exc).__name__}: {exc}"
