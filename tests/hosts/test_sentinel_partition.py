"""A Sentinel master cut from the majority while a client still reaches it: renewals are refused.

Six hosts on one bridge: the master, two replicas and three sentinels, one
each. A holds a lease through ``hold()`` with ``replicas=1`` from this
process, which reaches every host (a third side, like a pod the partition did
not touch). The master's host is then cut from the other five: the sentinels
promote a replica, while the old master, alone, still answers A. Its
renewals there reach no replica (``WAIT`` counts 0), so they are refused and
A's body is stopped; B, a client made after the switch, gets the key from the
new master only once A's replicated lease expired there.

What is guaranteed, and tested: A's body ended before B's acquire was sent,
and B's fence is above A's. Whether the old master would also have kept A's
lease without ``replicas`` is not a guarantee (tests/lease/test_failover_sentinel.py
measures that overlap on loopback).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator

import anyio
import pytest

from leaseworker import Lease, LeaseLost, LeaseUnavailable, RedisLeases, hold
from leaseworker._lease import now
from leaseworker_dev._services import Hosts, LocalSentinelGroup

LEASE = 4.0
"""Seconds: long enough for a loaded machine's failover, short enough for a quick test."""


@pytest.fixture(scope="module")
def group(hosts: Hosts) -> Iterator[LocalSentinelGroup]:
    """A Sentinel group whose six nodes each run on a host of their own."""
    names = ["master", "replica1", "replica2", "sentinel0", "sentinel1", "sentinel2"]
    places = [hosts.add(name).place for name in names]
    started = LocalSentinelGroup.start(places=places)
    try:
        yield started
    finally:
        started.stop()


@pytest.mark.timeout(180)
async def test_the_master_cut_from_the_majority_refuses_renewals_before_the_new_master_grants(
    hosts: Hosts, group: LocalSentinelGroup
) -> None:
    """A's renewal is refused unreplicated and its body stopped before B's acquire; fences rise."""
    await group.settle()
    key = f"k{uuid.uuid4().hex[:8]}"
    a_in, b_done = anyio.Event(), anyio.Event()
    a_stopped, a_fence, a_error = math.inf, 0, None

    async def hold_a(a: RedisLeases) -> None:
        nonlocal a_stopped, a_fence, a_error
        try:
            async with hold(a, key, lease_duration=LEASE, renewal_interval=LEASE / 4) as held:
                a_fence = held.fence
                a_in.set()
                try:
                    with anyio.move_on_after(3 * LEASE + 60):
                        await b_done.wait()
                        await anyio.sleep(3 * LEASE)  # an overlapping A still ends
                finally:
                    a_stopped = now()
        except Exception as exc:  # lost: stopped, as measured
            a_error = exc
        finally:
            a_in.set()

    async with group.master_client() as a_client, anyio.create_task_group() as tg:
        # WAIT gives up after 1 s (the default, half the call): a refusal, not a timeout.
        a = RedisLeases(a_client, command_timeout=2.0, replicas=1)
        tg.start_soon(hold_a, a)
        with anyio.fail_after(30):
            await a_in.wait()
        assert a_error is None, a_error
        old = await group.master()
        cut_off = hosts.at(old.address[0])
        try:
            for node in [*group.servers, *group.sentinels]:
                if node is not old:
                    hosts.cut(cut_off, hosts.at(node.address[0]))
            new = await group.wait_for_new_master(old)
            assert new is not old
            role = await anyio.to_thread.run_sync(old.role)
            assert role[0] == "master"  # alone, it still answers A as a master
            async with group.master_client() as b_client:
                b = RedisLeases(b_client, command_timeout=2.0)
                with anyio.fail_after(3 * LEASE + 30):
                    lease = await _acquire_when_free(b, key)
                b_done.set()
                await b.release(lease)
        finally:
            hosts.heal()
    print(f"A: {a_error!r}; B acquired {lease.sent_at - a_stopped:.3f}s after A stopped")
    assert isinstance(a_error, LeaseLost), a_error
    assert a_error.reason == "unreplicated", a_error  # the old master answered, alone
    assert a_stopped < lease.sent_at, f"A ran {a_stopped - lease.sent_at:.3f}s after B's acquire"
    assert lease.fence > a_fence
    await group.settle()


async def _acquire_when_free(leases: RedisLeases, key: str) -> Lease:
    """Acquire every 50 ms until the key is free, as a pod would."""
    while True:
        try:
            lease = await leases.acquire(key, LEASE)
        except LeaseUnavailable:  # the master is switching
            lease = None
        if lease is not None:
            return lease
        await anyio.sleep(0.05)
