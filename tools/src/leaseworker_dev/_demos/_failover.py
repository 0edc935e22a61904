"""``leaseworker demo failover``: Redis's documented lock failure, on a real Sentinel group.

A acquires; the master dies before any replica got the lease; Sentinel
promotes a replica; B acquires there. Run once with ``replicas=0`` (A ran on:
the overlap) and once with ``replicas=1`` (A's acquire was never
acknowledged, so its job never started). Exits 1 if the second run overlaps.
See docs/operations.md#redis-topology.
"""

from __future__ import annotations

import secrets

import anyio

from leaseworker.toolkit import LeaseBusy, LeaseLost, LeaseUnavailable, RedisLeases, hold

from .._services import LocalSentinelGroup, LocalStack
from ._incident import KEY, Timeline

LEASE_DURATION = 24.0
"""Lease duration of both runs: A renews every quarter of it, after the failover has completed."""


async def failover_run(group: LocalSentinelGroup, replicas: int) -> Timeline:
    """One replay: cut replication off, A acquires, the master is killed, B acquires."""
    line = Timeline(f"replicas={replicas}: the master dies before replicating A's lease")
    namespace = f"demo-{secrets.token_hex(4)}"
    master = await group.settle()
    for node in group.servers:
        if node is not master:
            await group.cut_off(node)
    line.note("-", "replication to every replica cut off")
    entered = anyio.Event()
    line.intervals["A"] = (0.0, 0.0)  # a job that never started ran for no time
    async with group.master_client() as client, anyio.create_task_group() as tg:
        leases = RedisLeases(
            client, namespace=namespace, command_timeout=0.5, replicas=replicas, replica_timeout=0.2
        )
        tg.start_soon(_worker_a, line, leases, entered)
        await entered.wait()
        group.kill(master)
        line.note("-", "master SIGKILLed")
        for node in group.servers:
            if node.paused:
                group.resume(node)
        await group.wait_for_new_master(master)
        line.note("-", "Sentinel promoted a replica (it never saw A's lease)")
        await _worker_b(line, group, namespace)
    return line


async def _worker_a(line: Timeline, leases: RedisLeases, entered: anyio.Event) -> None:
    start = stop = 0.0
    try:
        async with hold(
            leases, KEY, lease_duration=LEASE_DURATION, renewal_interval=LEASE_DURATION / 4
        ) as held:
            start = line.note("A", f"acquired the lease (fence {held.fence}), job starts")
            entered.set()
            try:
                await anyio.sleep(3 * LEASE_DURATION)
            finally:
                stop = line.note("A", "job stopped")
                line.intervals["A"] = (start, stop)
    except LeaseUnavailable as refused:
        line.note("A", f"acquire refused, job never starts ({refused})")
    except LeaseLost as lost:
        line.note("A", f"LeaseLost: reason={lost.reason}")
    finally:
        entered.set()


async def _worker_b(line: Timeline, group: LocalSentinelGroup, namespace: str) -> None:
    async with group.master_client() as client:
        leases = RedisLeases(client, namespace=namespace, command_timeout=0.5)
        line.note("B", "a pod connecting after the switch tries the lease")
        while True:
            try:
                async with hold(leases, KEY, lease_duration=LEASE_DURATION) as held:
                    start = line.note("B", f"acquired the lease (fence {held.fence}), job starts")
                    await anyio.sleep(1.0)
                    stop = line.note("B", "job finished")
            except (LeaseBusy, LeaseUnavailable):
                await anyio.sleep(0.05)  # a pod retries with backoff; the demo polls
                continue
            line.intervals["B"] = (start, stop)
            return


async def replay(group: LocalSentinelGroup) -> int:
    """Run both replays, print them, return the exit code."""
    unacknowledged = await failover_run(group, replicas=0)
    print(unacknowledged.render(), end="\n\n", flush=True)
    acknowledged = await failover_run(group, replicas=1)
    print(acknowledged.render(), flush=True)
    print(
        f"\nresult: replicas=0 overlap {unacknowledged.overlap() * 1000:.0f} ms, "
        f"replicas=1 overlap {acknowledged.overlap() * 1000:.0f} ms"
    )
    return 1 if acknowledged.overlap() > 0 else 0


def failover_demo() -> int:
    """Start a local Sentinel group, replay both runs, stop it; return the exit code."""
    print("starting a Sentinel group (master, two replicas, three sentinels)\n", flush=True)
    with LocalStack() as stack:
        return anyio.run(replay, stack.sentinel)
