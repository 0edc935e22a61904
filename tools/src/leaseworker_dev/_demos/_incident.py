"""``leaseworker demo incident``: the incident, reproduced with a naive lock and fixed with hold().

Two workers, A and B, want the same job key. A's job runs twice as long as the
lease TTL. With a naive lock (SET NX PX, no renewal, no cancellation) B acquires
when A's key expires while A is still running, and A's late release deletes
nothing. With ``hold()`` and A's renewals black-holed, A is cancelled at its
local deadline, before its key can expire, and B acquires only afterwards.
Then the same with a CPU-bound job that never awaits, A a process of its own:
run in A's event loop it overlaps B (the loop cannot be cancelled, nor renew);
run through ``held.run_in_process`` its child is killed before the lease
could expire. Each run goes on one timeline against a private redis-server;
the command exits 1 if a leaseworker run overlaps.
"""

from __future__ import annotations

import functools
import json
import secrets
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream
from redis.asyncio import Redis

from leaseworker.toolkit import RELEASE, ChaosProxy, LeaseBusy, LeaseLost, RedisLeases, hold

from .._services import ExitWatch, LocalStack, read_marks
from ._cpu_holder import Where

KEY = "report:acme:2026-11"


@dataclass
class Timeline:
    """Events of one run on a shared clock, plus each worker's job interval."""

    title: str
    origin: float = field(default_factory=anyio.current_time)
    events: list[tuple[float, str, str]] = field(default_factory=list)
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)

    def note(self, worker: str, text: str, *, at: float | None = None) -> float:
        """Record ``text`` for ``worker`` now (or at monotonic ``at``); return its time."""
        since = (anyio.current_time() if at is None else at) - self.origin
        self.events.append((since, worker, text))
        return since

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

    async with ChaosProxy(port) as proxy, anyio.create_task_group() as tg:
        tg.start_soon(worker_a, proxy)
        tg.start_soon(contender, line, direct, a_started, lease_duration)
    return line


async def contender(
    line: Timeline, leases: RedisLeases, after: anyio.Event, lease_duration: float
) -> None:
    """Worker B: once ``after`` is set, poll ``hold()`` until it gets the lease, work, release."""
    await after.wait()
    line.note("B", "tries the lease")
    while True:
        try:
            async with hold(leases, KEY, lease_duration=lease_duration) as held:
                start = line.note("B", f"acquired the lease (fence {held.fence}), job starts")
                await anyio.sleep(lease_duration / 2)
                stop = line.note("B", "job finished")
        except LeaseBusy:
            await anyio.sleep(0.01)
            continue
        line.intervals["B"] = (start, stop)
        return


CPU_TITLES = {
    "loop": "CPU-bound job in the event loop (A: a process of its own; never awaits)",
    "process": "CPU-bound job through held.run_in_process (the same loop, in a child)",
}


async def cpu_run(redis: Redis, port: int, lease_duration: float, where: Where) -> Timeline:
    """Replay the CPU-bound incident: A computes without awaiting, its Redis black-holed.

    A is a process of its own (:mod:`._cpu_holder`), so its stuck event loop
    does not stop B. Where A's code ran until is read from its marks on the
    monotonic clock (the last one, and for a child the kernel's exit time),
    not from what A says.
    """
    line = Timeline(CPU_TITLES[where])
    namespace = f"demo-{secrets.token_hex(4)}"
    direct = RedisLeases(redis, namespace=namespace, command_timeout=lease_duration / 5)
    a_started = anyio.Event()
    with tempfile.TemporaryDirectory(prefix="leaseworker-incident-") as scratch:
        marks = Path(scratch) / "marks"
        async with ChaosProxy(port) as proxy:
            warms = " and warms its one-worker pool" if where == "process" else ""
            line.note("A", f"process A starts (a process of its own){warms}")
            argv = [sys.executable, "-m", f"{__package__}._cpu_holder", str(proxy.port)]
            argv += [namespace, KEY, str(lease_duration), where, str(marks)]
            async with (
                await anyio.open_process(argv, stdin=subprocess.DEVNULL) as holder,
                anyio.create_task_group() as tg,
            ):
                tg.start_soon(contender, line, direct, a_started, lease_duration)
                with ExitWatch() as watch:
                    child = await _follow(
                        holder, line, proxy, a_started, lease_duration, marks, watch
                    )
                    ended = await anyio.to_thread.run_sync(functools.partial(_ended, watch, child))
        found = read_marks(marks)
    last = max((m[-1] for m in found.values() if m), default=line.origin)
    line.note("A", f"last mark of A's CPU loop (pid {','.join(map(str, found))})", at=last)
    if ended is not None:
        line.note("A", f"A's child {child} exited (the kernel's time, by pidfd)", at=ended)
    start = next(at for at, worker, text in line.events if worker == "A" and "acquired" in text)
    line.intervals["A"] = (start, max(last, ended or last) - line.origin)
    return line


async def _follow(
    holder: anyio.abc.Process,
    line: Timeline,
    proxy: ChaosProxy,
    started: anyio.Event,
    lease_duration: float,
    marks: Path,
    watch: ExitWatch,
) -> int | None:
    """Put A's lines on the timeline, black-hole its Redis after a while; return its child's pid.

    The child is the process other than A that marks ``marks``; it is watched
    as soon as it appears, for its exit time.
    """
    assert holder.stdout is not None
    child: int | None = None

    async def blackhole_later() -> None:
        await anyio.sleep(0.4 * lease_duration)
        proxy.blackhole = True
        line.note("A", "network to Redis black-holed: renewals get no answer")

    async def find_child() -> None:
        nonlocal child
        while child is None:
            others = [pid for pid in read_marks(marks) if pid != holder.pid]
            if others and watch.add(others[0]):
                child = others[0]
            await anyio.sleep(0.005)

    said = BufferedByteReceiveStream(holder.stdout)
    async with anyio.create_task_group() as tg:
        while True:
            try:
                event = json.loads(await said.receive_until(b"\n", 65536))
            except (anyio.EndOfStream, anyio.IncompleteRead):
                break
            line.note("A", event["text"], at=event["at"])
            if event["event"] == "acquired":
                started.set()
                tg.start_soon(blackhole_later)
                tg.start_soon(find_child)
        tg.cancel_scope.cancel()
    await holder.wait()
    return child


def _ended(watch: ExitWatch, child: int | None) -> float | None:
    """Return when ``child`` exited (it has, or is about to: A reaped or killed it)."""
    return None if child is None else watch.exited(child, within=5.0)


async def replay(port: int, lease_duration: float) -> int:
    """Run the four scenarios, print them; return 1 if a leaseworker run overlapped, else 0."""
    redis = Redis(host="127.0.0.1", port=port)
    try:
        naive = await naive_run(redis, lease_duration)
        print(naive.render(), end="\n\n", flush=True)
        fixed = await leaseworker_run(redis, port, lease_duration)
        print(fixed.render(), end="\n\n", flush=True)
        in_loop = await cpu_run(redis, port, lease_duration, "loop")
        print(in_loop.render(), end="\n\n", flush=True)
        in_child = await cpu_run(redis, port, lease_duration, "process")
        print(in_child.render(), flush=True)
    finally:
        await redis.aclose()
    print(
        f"\nresult: naive overlap {_ms(naive)}, leaseworker overlap {_ms(fixed)}; "
        f"CPU-bound job: in the event loop {_ms(in_loop)}, through run_in_process {_ms(in_child)}"
    )
    return 1 if fixed.overlap() > 0 or in_child.overlap() > 0 else 0


def _ms(line: Timeline) -> str:
    return f"{line.overlap() * 1000:.0f} ms"


def incident_demo(lease_duration: float) -> int:
    """Start a private redis-server, replay both scenarios, stop it; return the exit code."""
    print(f"starting a private redis-server; lease duration {lease_duration}s\n", flush=True)
    with LocalStack() as stack:
        return anyio.run(replay, stack.redis.port, lease_duration)
