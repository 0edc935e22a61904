"""``MemoryLeases``: the lease store in this process's memory, with Redis's rules and faults.

The same owner tokens, fences, TTL rounding, local-deadline formula, key
checks and error translation as :class:`~leaseworker.RedisLeases` (one
conformance suite runs against both, ``tests/lease/test_lease_conformance.py``),
and switches for what a real Redis does to a lease: a slow or black-holed
link, a refused connection, a key that expires or is taken, a renewal that
fails one particular way. Every call runs on the event loop's clock, so on a
:class:`~leaseworker.testing.VirtualTimeLoop` its timeouts cost no real time.
"""

from __future__ import annotations

import math
import secrets
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, TypeVar, final

import anyio

from .._errors import LeaseUnavailable
from .._lease import (
    DeadlinePolicy,
    Lease,
    LeaseInfo,
    check_lease_duration,
    checked_key,
    describe_failure,
    duration_from_ttl,
    judge_renewal,
    lease_lost,
    now,
    ttl_ms,
)
from .._outcome import LeaseLostReason
from ._clock import stall

RenewalFault = Literal["rejected", "timeout", "late", "error"]
"""How a renewal fails: key gone, no answer in time, an answer after the deadline, an error."""

_T = TypeVar("_T")

AtCheckpoint = Callable[[Lease], Awaitable[LeaseLostReason | None]]
"""What runs at a held lease's ``checkpoint()``; a reason it returns makes ownership uncertain."""


@dataclass(frozen=True, slots=True)
class _Key:
    owner: str
    expires_at: float


@final
class MemoryLeases:
    """A :class:`~leaseworker.LeaseStore` held in dicts, for tests; see the module docstring.

    ::

        leases = MemoryLeases(command_timeout=0.2)
        async with hold(leases, "report:acme:2026-11", lease_duration=30) as held:
            leases.fail_renewals("timeout")   # the next renewal gets no answer
            await anyio.sleep_forever()       # -> LeaseLost(reason="timeout")

    Switches, as :class:`~leaseworker.testing.ChaosProxy` has for a real
    Redis: ``blackhole`` (requests vanish: every call times out after
    ``command_timeout``), ``refuse`` (calls fail at once, as with a dead
    server), ``reply_delay`` (each answer arrives that many seconds after the
    command ran). :meth:`fail_renewals` fails the next renewals one chosen way;
    :meth:`delete` and :meth:`take` do what expiry, eviction or another pod do
    to the key; :meth:`restart_empty` is a Redis restart without persistence;
    :meth:`at_checkpoints` runs a function at every held lease's
    ``checkpoint()`` (the work's time, a loss found there).
    """

    def __init__(
        self,
        *,
        drift: float = 0.01,
        margin: float = 0.05,
        command_timeout: float = 0.5,
        owner_prefix: str = "memory",
    ) -> None:
        self._policy = DeadlinePolicy(drift=drift, margin=margin, command_timeout=command_timeout)
        self._owner_prefix = owner_prefix
        self._keys: dict[str, _Key] = {}
        self._fences: dict[str, int] = {}
        self._notes: dict[str, str] = {}  # the last acquisition's note, per key
        self._fence_floor = 0  # what Redis's server-time floor keeps after a restart
        self._renewal_faults: deque[RenewalFault] = deque()
        self._at_checkpoint: AtCheckpoint | None = None
        self.blackhole = False
        self.refuse = False
        self.reply_delay = 0.0
        self.renewals = 0
        """Renewal requests received (answered or not)."""

    @property
    def policy(self) -> DeadlinePolicy:
        """The deadline policy every lease from this store is computed with."""
        return self._policy

    # -- the LeaseStore protocol ----------------------------------------------------

    async def acquire(
        self,
        key: str,
        lease_duration: float | None = None,
        *,
        note: str = "",
        ttl: float | None = None,
    ) -> Lease | None:
        """Take the lease for ``key`` for ``lease_duration`` seconds, or ``None`` when held.

        (``ttl=`` is the deprecated spelling of ``lease_duration``.)
        ``note`` stays with this acquisition; the next one gets it back as
        :attr:`~leaseworker.Lease.previous` (``""`` leaves none), as on Redis.

        Raises :class:`LeaseUnavailable` when the store is refused, black-holed
        or answers later than ``command_timeout`` (a lease it took meanwhile is
        released again, as ``RedisLeases`` does).
        """
        if lease_duration is None:
            lease_duration = duration_from_ttl("MemoryLeases.acquire()", ttl)
        check_lease_duration(lease_duration)
        checked_key(key)
        owner = f"{self._owner_prefix}:{secrets.token_hex(12)}"
        sent_at = now()
        try:
            taken = await self._round_trip(lambda: self._take(key, owner, lease_duration, note))
        except TimeoutError as exc:
            self._forget(key, owner)
            raise LeaseUnavailable(key, describe_failure(exc)) from exc
        except OSError as exc:
            raise LeaseUnavailable(key, describe_failure(exc)) from exc
        except anyio.get_cancelled_exc_class():
            self._forget(key, owner)
            raise
        if taken is None:
            return None
        fence, previous = taken
        deadline = self._policy.local_deadline(sent_at, lease_duration)
        return Lease(
            key=key,
            owner=owner,
            fence=fence,
            lease_duration=lease_duration,
            sent_at=sent_at,
            local_deadline=deadline,
            previous=previous,
        )

    async def renew(self, lease: Lease) -> Lease:
        """Extend ``lease`` by its TTL from now, or raise :class:`LeaseLost` (Redis's reasons)."""
        sent_at = now()
        self.renewals += 1
        fault = self._renewal_faults.popleft() if self._renewal_faults else None
        if fault == "rejected":
            self.delete(lease.key)
        try:
            renewed = await self._renewal_trip(lease, fault)
        except TimeoutError as exc:
            raise lease_lost(lease, "timeout", describe_failure(exc)) from exc
        except OSError as exc:
            raise lease_lost(lease, "error", describe_failure(exc)) from exc
        if renewed and fault == "late":
            stall(max(0.0, lease.local_deadline - now()) + 0.001)  # the loop was blocked
        return judge_renewal(lease, sent_at=sent_at, policy=self._policy, extended=renewed)

    async def release(self, lease: Lease) -> bool:
        """Delete the lease if this owner still holds it; return whether it did."""
        try:
            return await self._round_trip(lambda: self._delete_own(lease.key, lease.owner))
        except OSError as exc:  # TimeoutError included
            raise LeaseUnavailable(lease.key, describe_failure(exc)) from exc

    async def inspect(self, key: str) -> LeaseInfo:
        """Read the owner, remaining TTL and last fence of ``key``."""
        try:
            return await self._round_trip(lambda: self._info(key))
        except OSError as exc:  # TimeoutError included
            raise LeaseUnavailable(key, describe_failure(exc)) from exc

    async def checkpoint(self, lease: Lease) -> LeaseLostReason | None:
        """Asked by a held lease at each ``checkpoint()``: what :meth:`at_checkpoints` armed."""
        if self._at_checkpoint is None:
            return None
        return await self._at_checkpoint(lease)

    # -- what happens to the keys ------------------------------------------------------

    def at_checkpoints(self, handler: AtCheckpoint | None) -> None:
        """Run ``handler(lease)`` at every held lease's ``checkpoint()`` (``None``: nothing).

        A loss reason it returns makes ownership uncertain at that checkpoint,
        as if a renewal had just failed that way (:class:`~leaseworker.LeaseLost`).
        """
        self._at_checkpoint = handler

    def fail_renewals(self, how: RenewalFault, *, times: int = 1) -> None:
        """Fail the next ``times`` renewals (of any key) ``how``.

        ``rejected``: the key is gone when the renewal arrives; ``timeout``: no
        answer within ``command_timeout``; ``late``: the answer is processed
        after the lease's local deadline (the loop was blocked meanwhile: a
        jump on virtual time, a real stall otherwise); ``error``: the
        connection breaks.
        """
        self._renewal_faults.extend([how] * times)

    def clear_renewal_faults(self) -> None:
        """Forget the renewal failures :meth:`fail_renewals` queued that no renewal used yet."""
        self._renewal_faults.clear()

    def delete(self, key: str) -> None:
        """Delete ``key``'s lease, as expiry, eviction or an operator would; its fence stays."""
        self._keys.pop(key, None)

    def take(
        self,
        key: str,
        lease_duration: float | None = None,
        *,
        owner: str = "another-pod",
        ttl: float | None = None,
    ) -> Lease:
        """Let another owner acquire ``key`` now, whoever held it: a takeover. Returns its lease.

        (``ttl=`` is the deprecated spelling of ``lease_duration``.)
        """
        if lease_duration is None:
            lease_duration = duration_from_ttl("MemoryLeases.take()", ttl)
        self.delete(key)
        token = f"{owner}:{secrets.token_hex(12)}"
        taken = self._take(key, token, lease_duration, "")
        assert taken is not None
        fence, previous = taken
        sent_at = now()
        return Lease(
            key=key,
            owner=token,
            fence=fence,
            previous=previous,
            lease_duration=lease_duration,
            sent_at=sent_at,
            local_deadline=self._policy.local_deadline(sent_at, lease_duration),
        )

    def restart_empty(self) -> None:
        """Lose every key and fence counter; later fences still rise (Redis's time floor)."""
        self._fence_floor = max([self._fence_floor, *self._fences.values()])
        self._keys.clear()
        self._fences.clear()
        self._notes.clear()

    def holder(self, key: str) -> str | None:
        """Return the owner token holding ``key`` right now, or ``None``."""
        held = self._live(key)
        return None if held is None else held.owner

    # -- the commands, as Redis runs them ---------------------------------------------

    async def _round_trip(self, command: Callable[[], _T]) -> _T:
        """Run ``command`` as a request on the switches' network; raise like a client would."""
        timeout = self._policy.command_timeout
        if self.refuse:
            raise ConnectionRefusedError("refused (MemoryLeases.refuse)")
        if self.blackhole:
            await anyio.sleep(timeout)
            raise TimeoutError
        answer = command()
        if self.reply_delay >= timeout:
            await anyio.sleep(timeout)
            raise TimeoutError
        if self.reply_delay > 0:
            await anyio.sleep(self.reply_delay)
        return answer

    async def _renewal_trip(self, lease: Lease, fault: RenewalFault | None) -> bool:
        """Send one renewal; an injected ``timeout`` or ``error`` replaces the network's answer."""
        if fault == "timeout":
            await anyio.sleep(self._policy.command_timeout)
            raise TimeoutError
        if fault == "error":
            raise ConnectionResetError("injected by MemoryLeases.fail_renewals")
        return await self._round_trip(lambda: self._extend(lease))

    def _live(self, key: str) -> _Key | None:
        held = self._keys.get(key)
        if held is not None and now() >= held.expires_at:
            del self._keys[key]
            return None
        return held

    def _take(
        self, key: str, owner: str, lease_duration: float, note: str
    ) -> tuple[int, str | None] | None:
        """SET NX PX, the fence increment and the note swap; ``None`` when someone holds the key."""
        if self._live(key) is not None:
            return None
        fence = max(self._fences.get(key, 0), self._fence_floor) + 1
        self._fences[key] = fence
        self._keys[key] = _Key(owner, now() + int(ttl_ms(lease_duration)) / 1000)
        previous = self._notes.pop(key, None)
        if note:
            self._notes[key] = note
        return fence, previous

    def _extend(self, lease: Lease) -> bool:
        held = self._live(lease.key)
        if held is None or held.owner != lease.owner:
            return False
        self._keys[lease.key] = _Key(lease.owner, now() + int(ttl_ms(lease.lease_duration)) / 1000)
        return True

    def _delete_own(self, key: str, owner: str) -> bool:
        held = self._live(key)
        if held is None or held.owner != owner:
            return False
        del self._keys[key]
        return True

    def _forget(self, key: str, owner: str) -> None:
        """Release an acquire whose answer was lost, if the request got through."""
        if not (self.refuse or self.blackhole):
            self._delete_own(key, owner)

    def _info(self, key: str) -> LeaseInfo:
        held = self._live(key)
        ttl = None if held is None else math.ceil((held.expires_at - now()) * 1000) / 1000
        return LeaseInfo(
            key=key,
            owner=None if held is None else held.owner,
            ttl=ttl,
            fence=self._fences.get(key),
        )

    def __repr__(self) -> str:
        return f"MemoryLeases(keys={len(self._keys)})"
