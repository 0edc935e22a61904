"""``leaseworker demo incident``: the incident, reproduced with a naive lock and fixed with hold().

Two workers, A and B, want the same job key. A's job runs twice as long as the
lease TTL. With a naive lock (SET NX PX, no renewal, no cancellation) B acquires
when A's key expires while A is still running, and A's late release deletes
nothing. With ``hold()`` and A's renewals black-holed, A is cancelled at its
local deadline, before its key can expire, and B acquires only afterwards.
Both runs go on one timeline against a private redis-server; the command exits
1 if the leaseworker run overlaps.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import anyio
from redis.asyncio import Redis

from leaseworker.toolkit import RELEASE, ChaosProxy, LeaseBusy, LeaseLost, RedisLeases, hold

from .._services import LocalStack

KEY = "report:acme:2026-11"


@dataclass
class Timeline:
    """Events of one run on a shared clock, plus each worker's job interval."""

    title: str
    origin: float = field(default_factory=anyio.current_time)
    events: list[tuple[float, str, str]] = field(default_factory=list)
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)

    def note(self, worker: str, text: str) -> float:
        """Record ``text`` for ``worker`` now; return the time since the origin."""
        at = anyio.current_time() - self.origin
        self.events.append((at, worker, text))
        return at

    def overlap(self) -> float:
        """Seconds during which A's and B's jobs both ran."""
        (a_start, a_stop), (b_start, b_stop) = self.intervals["A"], self.intervals["B"]
        return max(0.0, min(a_stop, b_stop) - max(a_start, b_start))

    def render(self) -> str:
        """Return the timeline as aligned text lines."""
        lines = [f"== {self.title}"]
        lines += [f"  t={at:6.3f}s  {worker}  {text}" for at, worker, text in sorted(self.events)]
        lines.append(f"  overlap of A and B: {self.overlap() * 1000:.0f} ms")
        return "\n".join(lines)


async def naive_run(redis: Redis, lease_duration: float) -> Timeline:
    """Replay with a plain SET NX PX lock: nothing renews it and nothing stops A."""
    line = Timeline("naive lock (SET NX PX, no renewal, no cancellation)")
    lock = f"naive:{secrets.token_hex(4)}:{{{KEY}}}:lock"

    async def worker_a() -> None:
        token = secrets.token_hex(8)
        await redis.set(lock, token, nx=True, px=int(lease_duration * 1000))
        start = line.note("A", "acquired the lock, job starts (runs 2 x TTL)")
        await anyio.sleep(2 * lease_duration)
        stop = line.note("A", "job finished")
        deleted = await redis.eval(RELEASE, 1, lock, token)
        line.note("A", f"late release deleted {int(deleted)} key(s): the lock was B's by now")
        line.intervals["A"] = (start, stop)

    async def worker_b() -> None:
        await anyio.sleep(0.2 * lease_duration)
        line.note("B", "tries the lock")
        token = secrets.token_hex(8)
        # A naive pod polls the lock; that is the incident's code, kept as it was.
        while not await redis.set(lock, token, nx=True, px=int(lease_duration * 1000)):  # noqa: ASYNC110
            await anyio.sleep(0.01)
        start = line.note("B", "acquired the lock while A still runs, job starts")
        await anyio.sleep(lease_duration)
        stop = line.note("B", "job finished")
        await redis.eval(RELEASE, 1, lock, token)
        line.intervals["B"] = (start, stop)

    async with anyio.create_task_group() as tg:
        tg.start_soon(worker_a)
        tg.start_soon(worker_b)
    return line


async def leaseworker_run(redis: Redis, port: int, lease_duration: float) -> Timeline:
    """Replay with hold() and A's renewals black-holed: A stops before B starts."""
    line = Timeline("leaseworker hold() (A's Redis traffic black-holed after a while)")
    namespace = f"demo-{secrets.token_hex(4)}"
    direct = RedisLeases(redis, namespace=namespace, command_timeout=lease_duration / 5)
    a_started = anyio.Event()

    async def worker_a(proxy: ChaosProxy) -> None:
        client = Redis(host="127.0.0.1", port=proxy.port)
        leases = RedisLeases(client, namespace=namespace, command_timeout=lease_duration / 5)
        start = stop = 0.0
        try:
            async with hold(
                leases, KEY, lease_duration=lease_duration, renewal_interval=lease_duration / 4
            ) as held:
                start = line.note("A", f"acquired the lease (fence {held.fence}), job starts")
                a_started.set()
                await anyio.sleep(0.4 * lease_duration)
                proxy.blackhole = True
                line.note("A", "network to Redis black-holed: renewals get no answer")
                try:
                    await anyio.sleep(2 * lease_duration)
                finally:
                    stop = line.note("A", "job cancelled at its next await")
                    with anyio.CancelScope(shield=True):
                        pttl = await redis.pttl(direct.lease_key(KEY))
                    line.note("A", f"(Redis still holds A's key: {pttl} ms left)")
        except LeaseLost as lost:
            line.note(
                "A",
                f"LeaseLost: reason={lost.reason}, stopped "
                f"{(lost.stop_latency or 0) * 1000:.1f} ms after the loss",
            )
        finally:
            await client.aclose()
        line.intervals["A"] = (start, stop)

    async def worker_b() -> None:
        await a_started.wait()
        line.note("B", "tries the lease")
        while True:
            try:
                async with hold(direct, KEY, lease_duration=lease_duration) as held:
                    start = line.note("B", f"acquired the lease (fence {held.fence}), job starts")
                    await anyio.sleep(lease_duration / 2)
                    stop = line.note("B", "job finished")
            except LeaseBusy:
                await anyio.sleep(0.01)
                continue
            line.intervals["B"] = (start, stop)
            return

    async with ChaosProxy(port) as proxy, anyio.create_task_group() as tg:
        tg.start_soon(worker_a, proxy)
        tg.start_soon(worker_b)
    return line


async def replay(port: int, lease_duration: float) -> int:
    """Run both scenarios, print them, return the exit code."""
    redis = Redis(host="127.0.0.1", port=port)
    try:
        naive = await naive_run(redis, lease_duration)
        print(naive.render(), end="\n\n", flush=True)
        fixed = await leaseworker_run(redis, port, lease_duration)
        print(fixed.render(), flush=True)
    finally:
        await redis.aclose()
    print(
        f"\nresult: naive overlap {naive.overlap() * 1000:.0f} ms, "
        f"leaseworker overlap {fixed.overlap() * 1000:.0f} ms"
    )
    return 1 if fixed.overlap() > 0 else 0


def incident_demo(lease_duration: float) -> int:
    """Start a private redis-server, replay both scenarios, stop it; return the exit code."""
    print(f"starting a private redis-server; lease duration {lease_duration}s\n", flush=True)
    with LocalStack() as stack:
        return anyio.run(replay, stack.redis.port, lease_duration)
