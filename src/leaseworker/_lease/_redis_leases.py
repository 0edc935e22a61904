"""Redis leases: acquire, renew and release with owner tokens and fences.

A :class:`Lease` is a value; :class:`RedisLeases` is the adapter that talks to
Redis through three atomic Lua scripts (see ``_scripts``). Every call is bounded
by ``command_timeout``; redis-py errors and timeouts are translated here into
leaseworker's exceptions. ``hold()`` builds the cancel-on-loss behaviour on top.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import secrets
import socket
from collections.abc import Sequence
from typing import final

import anyio
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from .._errors import ConfigError, LeaseLost, LeaseUnavailable
from . import _scripts
from ._deadlines import DeadlineWheel
from ._model import (
    Lease,
    LeaseInfo,
    check_lease_duration,
    checked_key,
    describe_failure,
    duration_from_ttl,
    ttl_ms,
)
from ._pipelining import ScriptPipeline
from ._routing import ClusterRouter
from ._timing import DeadlinePolicy, now
from ._trips import Call, ReplicaWait, Replied, run_script, run_scripts
from ._verdict import judge_renewal, lease_lost


@final
class RedisLeases:
    """Leases stored in Redis: a lease key and a fence key per job key.

    Keys are ``{namespace}:{<job key>}:lease`` and ``...:fence`` (the last fence,
    followed by the last acquisition's note); the braces are a Redis Cluster hash
    tag, so both keys of a job live in one slot and the scripts stay atomic on a
    cluster. Usage::

        leases = RedisLeases(redis.asyncio.Redis.from_url(url))
        lease = await leases.acquire("report:acme:2026-11", lease_duration=30)
        if lease is not None:
            lease = await leases.renew(lease)      # or LeaseLost
            await leases.release(lease)

    ``drift``, ``margin`` and ``command_timeout`` make up the
    :class:`DeadlinePolicy`; ``owner_prefix`` (default ``hostname:pid``) starts
    every owner token so operators can see which process holds a lease. With
    ``pipelining`` (the default), calls made while another is in flight go to
    Redis together, as one pipeline, once it is answered (see ``_pipelining``);
    ``False`` sends each call on its own.

    On replicated Redis (Sentinel, Cluster, a managed service with replicas),
    ``replicas=N`` makes an acquire or renewal count only once ``WAIT`` on the
    same connection reports N replicas have it within ``replica_timeout``
    (default: half the command timeout): an acquire short of that is released
    and raises :class:`LeaseUnavailable`, a renewal short of it loses the lease
    (``reason="unreplicated"``). So a failover cannot promote a replica that
    never saw the lease, nor an isolated master keep renewing it. ``WAIT`` is
    not consistency: a replica that acknowledged can still lose the write in a
    later failover; fences cover that (see docs/operations.md).
    """

    def __init__(
        self,
        redis: Redis | RedisCluster,
        *,
        namespace: str = "leaseworker",
        drift: float = 0.01,
        margin: float = 0.05,
        command_timeout: float = 0.5,
        owner_prefix: str | None = None,
        pipelining: bool = True,
        replicas: int = 0,
        replica_timeout: float | None = None,
    ) -> None:
        if not namespace or "{" in namespace or "}" in namespace:
            raise ConfigError(f"namespace must be non-empty and free of braces: {namespace!r}")
        self._wait = _replica_wait(replicas, replica_timeout, command_timeout)
        self._namespace = namespace
        self._policy = DeadlinePolicy(drift=drift, margin=margin, command_timeout=command_timeout)
        self._owner_prefix = owner_prefix or f"{socket.gethostname()}:{os.getpid()}"
        self._scripts = {src: hashlib.sha1(src.encode()).hexdigest() for src in _SCRIPTS}
        # Calls are cut off within command_timeout, never sooner than 31/32 of it.
        self._deadlines = DeadlineWheel(self._policy.command_timeout, resolution=32)
        # A renewal is sent at least lease_duration/3 before it matters: a few ms spent waiting
        # for others to share its trip cost nothing, and many held leases a trip each.
        self._linger = min(_RENEWAL_LINGER, command_timeout / 16)
        scripts = {sha: src for src, sha in self._scripts.items()}
        self._router: ClusterRouter | None = None
        self._pipeline: ScriptPipeline | None = None
        self._pipelining = pipelining
        self._node: Redis | None = None  # the one node, unless it is a cluster
        self._loaded: set[str] = set()  # scripts the node holds, unpipelined (see _trips)
        if isinstance(redis, RedisCluster):
            self._router = ClusterRouter(
                redis, scripts, self._deadlines, pipelining=pipelining, wait=self._wait
            )
        else:
            self._node = redis
            if pipelining:
                self._pipeline = ScriptPipeline(redis, scripts, self._deadlines, wait=self._wait)

    @property
    def policy(self) -> DeadlinePolicy:
        """The deadline policy every lease from this store is computed with."""
        return self._policy

    @property
    def pipelining(self) -> bool:
        """Whether calls made while one is in flight go to Redis together, as one pipeline."""
        return self._pipelining

    @property
    def replicas(self) -> int:
        """How many replicas must acknowledge an acquire or renewal (0: none asked)."""
        return 0 if self._wait is None else self._wait.replicas

    @property
    def namespace(self) -> str:
        """The prefix of every Redis key this store touches."""
        return self._namespace

    def lease_key(self, key: str) -> str:
        """Return the Redis key holding ``key``'s owner token."""
        return f"{self._namespace}:{{{checked_key(key)}}}:lease"

    def fence_key(self, key: str) -> str:
        """Return the Redis key holding ``key``'s last fence and its acquisition's note.

        Its value is ``"<fence> <note>"``, or ``"<fence>"`` without a note (see ``_scripts``).
        """
        return f"{self._namespace}:{{{checked_key(key)}}}:fence"

    async def acquire(
        self,
        key: str,
        lease_duration: float | None = None,
        *,
        note: str = "",
        ttl: float | None = None,
    ) -> Lease | None:
        """Take the lease for ``key`` for ``lease_duration`` seconds, or ``None`` when held.

        ``note`` (opaque text, e.g. a trace reference) is stored with this
        acquisition in the same script; the note the previous acquisition of
        ``key`` left comes back as :attr:`Lease.previous`.

        Raises :class:`LeaseUnavailable` when Redis fails or does not answer in
        time; the lease may then have been taken, so leaseworker releases it
        with the same owner token on a best-effort basis. ``ttl=`` is the
        deprecated spelling of ``lease_duration``.
        """
        if lease_duration is None:
            lease_duration = duration_from_ttl("RedisLeases.acquire()", ttl)
        check_lease_duration(lease_duration)
        owner = f"{self._owner_prefix}:{secrets.token_hex(12)}"
        keys = [self.lease_key(key), self.fence_key(key)]
        sent_at = now()
        try:
            reply = await self._call(_scripts.ACQUIRE, keys, [owner, ttl_ms(lease_duration), note])
        except (TimeoutError, *_CLIENT_ERRORS) as exc:
            await self._forget(key, owner)
            raise LeaseUnavailable(key, describe_failure(exc)) from exc
        except anyio.get_cancelled_exc_class():
            await self._forget(key, owner)
            raise
        acquired, value = int(reply.value[0]), int(reply.value[1])
        if not acquired:
            return None
        if not self._replicated(reply):
            await self._forget(key, owner)
            raise LeaseUnavailable(key, self._unreplicated(reply))
        deadline = self._policy.local_deadline(sent_at, lease_duration)
        return Lease(
            key=key,
            owner=owner,
            fence=value,
            lease_duration=lease_duration,
            sent_at=sent_at,
            local_deadline=deadline,
            previous=_text(reply.value[2]) or None,
        )

    async def renew(self, lease: Lease) -> Lease:
        """Extend ``lease`` by its TTL, measured from when this request is sent.

        Raises :class:`LeaseLost` when the lease is no longer this owner's
        (``rejected``), Redis errs (``error``) or does not answer within the
        command timeout (``timeout``), or the answer arrives after the lease's
        local deadline (``late``): a late success must not revive ownership
        that already lapsed locally.
        """
        sent_at = now()
        try:
            renewed = await self._call(
                _scripts.RENEW,
                [self.lease_key(lease.key)],
                [lease.owner, ttl_ms(lease.lease_duration)],
                linger=self._linger,
            )
        except (TimeoutError, *_CLIENT_ERRORS) as exc:
            renewed = Replied(exc, None)
        return self._renewal(lease, sent_at, renewed)

    async def renew_many(self, leases: Sequence[Lease]) -> list[Lease | LeaseLost]:
        """Renew every lease in one trip (one per node on a cluster): each gets renew()'s verdict.

        ``hold()`` renews the held leases that fall due together this way.
        """
        sent_at = now()
        calls: list[Call] = [
            ([self.lease_key(lease.key)], [lease.owner, ttl_ms(lease.lease_duration)])
            for lease in leases
        ]
        try:
            replies = await self._call_many(_scripts.RENEW, calls)
        except (TimeoutError, *_CLIENT_ERRORS) as exc:
            replies = [Replied(exc, None)] * len(calls)
        renewed: list[Lease | LeaseLost] = []
        for lease, reply in zip(leases, replies, strict=True):
            try:
                renewed.append(self._renewal(lease, sent_at, reply))
            except LeaseLost as lost:
                renewed.append(lost)
        return renewed

    def _renewal(self, lease: Lease, sent_at: float, reply: Replied) -> Lease:
        """Judge a renewal's reply (an error as its value): the renewed lease, or LeaseLost."""
        if isinstance(reply.value, TimeoutError):
            raise lease_lost(lease, "timeout", "no answer within command_timeout") from reply.value
        if isinstance(reply.value, _CLIENT_ERRORS):
            raise lease_lost(lease, "error", describe_failure(reply.value)) from reply.value
        unreplicated = None if self._replicated(reply) else self._unreplicated(reply)
        return judge_renewal(
            lease,
            sent_at=sent_at,
            policy=self._policy,
            extended=bool(int(reply.value)),
            unreplicated=unreplicated,
        )

    async def release(self, lease: Lease) -> bool:
        """Delete the lease if this owner still holds it; return whether it did.

        A stale owner's release returns ``False`` and leaves the newer owner's
        lease alone. Raises :class:`LeaseUnavailable` when Redis fails or times out.
        """
        try:
            deleted = await self._call(
                _scripts.RELEASE, [self.lease_key(lease.key)], [lease.owner], replicated=False
            )
        except (TimeoutError, *_CLIENT_ERRORS) as exc:
            raise LeaseUnavailable(lease.key, describe_failure(exc)) from exc
        return bool(int(deleted.value))

    async def release_many(self, leases: Sequence[Lease]) -> list[bool | LeaseUnavailable]:
        """Release every lease in one trip (one per node on a cluster); each answers as release().

        ``hold()`` releases the leases whose blocks end together this way.
        """
        calls: list[Call] = [([self.lease_key(lease.key)], [lease.owner]) for lease in leases]
        try:
            replies = await self._call_many(_scripts.RELEASE, calls, replicated=False)
        except (TimeoutError, *_CLIENT_ERRORS) as exc:
            replies = [Replied(exc, None)] * len(calls)
        return [
            LeaseUnavailable(lease.key, describe_failure(reply.value))
            if isinstance(reply.value, Exception)
            else bool(int(reply.value))
            for lease, reply in zip(leases, replies, strict=True)
        ]

    async def inspect(self, key: str) -> LeaseInfo:
        """Read the owner, remaining TTL and last fence of ``key`` in one round trip."""
        lease_key = self.lease_key(key)
        try:
            client = self._node or await self._router_client(key)
            async with client.pipeline(transaction=True) as pipe:
                pipe.get(lease_key)
                pipe.pttl(lease_key)
                pipe.get(self.fence_key(key))
                owner, pttl, fence = await self._deadlines.run(pipe.execute())
        except (TimeoutError, *_CLIENT_ERRORS) as exc:
            raise LeaseUnavailable(key, describe_failure(exc)) from exc
        return LeaseInfo(
            key=key,
            owner=_text(owner),
            ttl=int(pttl) / 1000 if owner is not None and int(pttl) >= 0 else None,
            fence=None if fence is None else _scripts.fence_of(fence),
        )

    async def _call(
        self,
        script: str,
        keys: Sequence[str],
        args: Sequence[str],
        *,
        replicated: bool = True,
        linger: float = 0.0,
    ) -> Replied:
        """Run ``script`` within the command timeout (see ``_deadlines``).

        ``replicated=False`` (a release) spares a lone call its ``WAIT``: a
        release lost in a failover brings the lease back until its TTL ends,
        which costs availability, not safety. ``linger``: see
        :meth:`ScriptPipeline.call` (only with pipelining).
        """
        sha = self._scripts[script]
        if self._router is not None:
            return await self._deadlines.run(
                self._router.call(sha, keys, args, replicated=replicated, linger=linger)
            )
        if self._pipeline is not None:
            return await self._deadlines.run(
                self._pipeline.call(sha, keys, args, replicated=replicated, linger=linger)
            )
        assert self._node is not None
        wait = self._wait if replicated else None
        trip = run_script(self._node, sha, script, keys, args, wait, self._loaded)
        return await self._deadlines.run(trip)

    async def _call_many(
        self, script: str, calls: Sequence[Call], *, replicated: bool = True
    ) -> list[Replied]:
        """Run ``script`` once per call in one trip (per node), each within the command timeout.

        Error replies come back as values, one per call. Pipelined, a trip's
        timeout runs from when it is written (see :meth:`ScriptPipeline.call_many`).
        """
        sha = self._scripts[script]
        if self._router is not None:
            return await self._router.call_many(sha, calls, replicated=replicated)
        if self._pipeline is not None:
            return await self._pipeline.call_many(sha, calls, replicated=replicated)
        assert self._node is not None
        wait = self._wait if replicated else None
        trip = run_scripts(self._node, sha, script, calls, wait, self._loaded)
        return await self._deadlines.run(trip)

    def _replicated(self, reply: Replied) -> bool:
        """Whether enough replicas acknowledged the write behind ``reply``."""
        return self._wait is None or (reply.acked or 0) >= self._wait.replicas

    def _unreplicated(self, reply: Replied) -> str:
        assert self._wait is not None
        return (
            f"{reply.acked or 0} of {self._wait.replicas} replicas acknowledged "
            f"within {self._wait.timeout_ms} ms"
        )

    async def _router_client(self, key: str) -> Redis:
        assert self._router is not None
        return await self._router.client_for(key)

    async def aclose(self) -> None:
        """Close the per-node clients a cluster needs and give back the pipeline's connection.

        The client passed in stays the caller's.
        """
        if self._router is not None:
            await self._router.aclose()
        if self._pipeline is not None:
            await self._pipeline.aclose()

    async def _forget(self, key: str, owner: str) -> None:
        """Best-effort release of an acquire whose reply never arrived (shielded)."""
        probe = Lease(key=key, owner=owner, fence=0, lease_duration=0, sent_at=0, local_deadline=0)
        with anyio.CancelScope(shield=True), contextlib.suppress(LeaseUnavailable):
            # On failure the lease expires after its TTL; nobody else can hold it meanwhile.
            await self.release(probe)


_SCRIPTS = (_scripts.ACQUIRE, _scripts.RENEW, _scripts.RELEASE)
_RENEWAL_LINGER = 0.01
"""Seconds a renewal made while nothing is in flight waits for others to share its trip."""
_CLIENT_ERRORS = (RedisError, RedisClusterException, OSError)
"""What any Redis client can raise: translated here, never passed to the job."""


def _replica_wait(
    replicas: int, replica_timeout: float | None, command_timeout: float
) -> ReplicaWait | None:
    """Build the ``WAIT`` sent after acquires and renewals, checked against the call budget."""
    if replicas < 0:
        raise ConfigError(f"replicas must be >= 0, got {replicas}")
    if replicas == 0:
        return None
    timeout = command_timeout / 2 if replica_timeout is None else replica_timeout
    if not 0 < timeout < command_timeout:
        raise ConfigError(
            f"replica_timeout={timeout}s must be > 0 and shorter than "
            f"command_timeout={command_timeout}s (the wait is part of each call's budget)"
        )
    return ReplicaWait(replicas=replicas, timeout_ms=max(1, math.floor(timeout * 1000)))


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value
