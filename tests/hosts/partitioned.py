"""The two sides of a Redis master cut from its majority: A holding, B acquiring after the switch.

A holds through ``hold()`` with ``replicas=1`` from this process, which reaches
every host; the test cuts A's master from the rest and has B acquire from the
new master. What both replica sets must show: A's renewal refused
``unreplicated`` and its body stopped before B's acquire was sent, B's fence
above A's.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import anyio

from leaseworker import Lease, LeaseLost, LeaseUnavailable, RedisLeases, hold
from leaseworker._lease import now
from leaseworker_dev._services import Hosts

LEASE = 4.0
"""Seconds: long enough for a loaded machine's failover, short enough for a quick test."""


@dataclass
class Holder:
    """A's side: its one hold, its fence, when its body stopped and how the hold ended."""

    fence: int = 0
    stopped: float = math.inf
    error: BaseException | None = None
    inside: anyio.Event = field(default_factory=anyio.Event)

    async def hold(
        self, leases: RedisLeases, key: str, body: Callable[[], Awaitable[None]]
    ) -> None:
        """Hold ``key`` while ``body`` runs; record the stop (set ``inside`` however it ends)."""
        try:
            async with hold(leases, key, lease_duration=LEASE, renewal_interval=LEASE / 4) as held:
                self.fence = held.fence
                self.inside.set()
                try:
                    await body()
                finally:
                    self.stopped = now()
        except Exception as exc:  # lost: stopped, as measured
            self.error = exc
        finally:
            self.inside.set()

    async def entered(self) -> None:
        """Return once the hold is inside its body (fail if it could not get there)."""
        with anyio.fail_after(30):
            await self.inside.wait()
        assert self.error is None, self.error

    def stopped_before(self, lease: Lease) -> None:
        """Assert the guarantee against B's ``lease``: A lost, unreplicated, stopped before it."""
        print(f"A: {self.error!r}; B acquired {lease.sent_at - self.stopped:.3f}s after A stopped")
        assert isinstance(self.error, LeaseLost), self.error
        assert self.error.reason == "unreplicated", self.error  # WAIT's 1 s, not the call's 2 s
        assert self.stopped < lease.sent_at, f"A ran {self.stopped - lease.sent_at:.3f}s after B"
        assert lease.fence > self.fence


def cut_from_the_rest(hosts: Hosts, address: str, others: Sequence[str]) -> None:
    """Cut the host at ``address`` from each host at ``others`` (itself skipped), both ways."""
    cut_off = hosts.at(address)
    for other in others:
        if other != address:
            hosts.cut(cut_off, hosts.at(other))


async def acquire_when_free(leases: RedisLeases, key: str) -> Lease:
    """Acquire every 50 ms until the key is free, as a pod would; fail after 3 leases + 30 s."""
    with anyio.fail_after(3 * LEASE + 30):
        while True:
            try:
                lease = await leases.acquire(key, LEASE)
            except LeaseUnavailable:  # the master is switching
                lease = None
            if lease is not None:
                return lease
            await anyio.sleep(0.05)
