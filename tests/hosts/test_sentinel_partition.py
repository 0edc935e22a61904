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

import uuid
from collections.abc import Iterator

import anyio
import pytest

from leaseworker import RedisLeases
from leaseworker_dev._services import Hosts, LocalSentinelGroup

from .partitioned import LEASE, Holder, acquire_when_free, cut_from_the_rest


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
    b_done = anyio.Event()
    a = Holder()

    async def body() -> None:
        with anyio.move_on_after(3 * LEASE + 60):
            await b_done.wait()
            await anyio.sleep(3 * LEASE)  # an overlapping A still ends

    async with group.master_client() as a_client, anyio.create_task_group() as tg:
        # WAIT gives up after 1 s (the default, half the call): a refusal, not a timeout.
        tg.start_soon(a.hold, RedisLeases(a_client, command_timeout=2.0, replicas=1), key, body)
        await a.entered()
        old = await group.master()
        try:
            nodes = [*group.servers, *group.sentinels]
            cut_from_the_rest(hosts, old.address[0], [node.address[0] for node in nodes])
            new = await group.wait_for_new_master(old)
            assert new is not old
            role = await anyio.to_thread.run_sync(old.role)
            assert role[0] == "master"  # alone, it still answers A as a master
            async with group.master_client() as b_client:
                b = RedisLeases(b_client, command_timeout=2.0)
                lease = await acquire_when_free(b, key)
                b_done.set()
                await b.release(lease)
        finally:
            hosts.heal()
    a.stopped_before(lease)
    await group.settle()
