"""ProcessPool.run with real child processes: results, errors, deaths, kills, lease news."""

from __future__ import annotations

import functools
import os
import pickle
import select
import signal
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from leaseworker import ChildProcessDied, ConfigError, LeaseLost, ProcessPool
from leaseworker._process import Identity, _frames, _pool
from leaseworker._process._pool_worker import NotTaken, PoolWorker
from tests.process import jobs
from tests.process.util import IDENTITY, Call, marked
from tests.process_work import alive
from tests.processes import child_commands


@pytest.fixture
async def pool() -> AsyncIterator[ProcessPool]:
    """A started pool of one worker, closed after the test."""
    async with ProcessPool(1, reap_timeout=1.0) as started:
        yield started


async def test_returns_the_result_and_reports_usage_once(pool: ProcessPool) -> None:
    """The function's return value comes back; its child saw the call's identity."""
    call = Call()
    assert await call.run(pool, jobs.add, 2, 3) == 5
    seen = await call.run(pool, jobs.identity)
    assert seen[:3] == (IDENTITY.job_key, IDENTITY.execution_id, IDENTITY.fence)  # type: ignore[index]
    assert len(call.usages) == 2
    assert call.unfollowed == 2
    assert all(not usage.killed and usage.peak_memory > 0 for usage in call.usages)


async def test_a_call_whose_reply_is_there_at_once_gives_the_loop_a_turn(
    pool: ProcessPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls in a row never starve the pod's other tasks, even when no call waits for its reply.

    The pod is held after each send until the reply is in the pipe (as when the
    child ran first on the pod's core), so its read finds it without a wait.
    """

    async def answered_at_once(self: PoolWorker, data: bytes) -> bytes | None:
        self.calls += 1
        await _frames.send(self._call, _frames.frame(data))
        select.select([self._reply], [], [], 10)
        return await self._replies.receive()

    monkeypatch.setattr(PoolWorker, "call", answered_at_once)
    turns = 0

    async def count_turns() -> None:
        nonlocal turns
        while True:
            turns += 1
            await anyio.lowlevel.checkpoint()

    call = Call()
    async with anyio.create_task_group() as tg:
        tg.start_soon(count_turns)
        await anyio.lowlevel.checkpoint()  # the counter runs once, then waits for a turn
        before = turns
        for _ in range(3):
            assert await call.run(pool, jobs.add, 1, 2) == 3
        assert turns - before >= 3
        tg.cancel_scope.cancel()


async def test_reraises_the_exception_with_the_child_traceback(pool: ProcessPool) -> None:
    """A raised exception crosses back as itself, the child's traceback as a note."""
    call = Call()
    with pytest.raises(ValueError, match="no data") as caught:
        await call.run(pool, jobs.fail, "no data")
    assert "in fail" in caught.value.__notes__[0]
    with pytest.raises(RuntimeError, match=r"tests\.process\.jobs\.OddError: a/b"):
        await call.run(pool, jobs.fail_oddly)
    with pytest.raises(TypeError, match="result cannot be pickled"):
        await call.run(pool, jobs.returns_a_lock)
    assert await call.run(pool, jobs.add, 1, 1) == 2
    assert len(call.usages) == 4


async def test_unpicklable_calls_are_refused_before_a_child_is_used() -> None:
    """A lambda, a local function or an unpicklable argument: one-line ConfigError, no child."""
    pool = ProcessPool(1)

    def local(pctx: object) -> None:
        return None

    call = Call()
    with pytest.raises(ConfigError, match=r"the function of .*<lambda>"):
        await call.run(pool, lambda pctx: None)
    with pytest.raises(ConfigError, match="local"):
        await call.run(pool, local)
    with pytest.raises(ConfigError, match=r"args\[1\] of add") as caught:
        await call.run(pool, jobs.add, 1, threading.Lock())
    assert "\n" not in str(caught.value)
    assert call.usages == []
    assert call.mirrors == []
    await pool.aclose()


async def test_a_child_that_dies_by_itself_raises_and_is_replaced(pool: ProcessPool) -> None:
    """A segfault and an os._exit raise ChildProcessDied; the next call runs on a new child."""
    call = Call()
    first = await call.run(pool, jobs.pid)
    assert isinstance(first, int)
    with pytest.raises(ChildProcessDied, match=r"\(SIGSEGV\)") as segv:
        await call.run(pool, jobs.segfault)
    assert (segv.value.pid, segv.value.signal, segv.value.exit_code) == (
        first,
        signal.SIGSEGV,
        None,
    )
    with pytest.raises(ChildProcessDied, match=r"\(exit code 3\)") as exited:
        await call.run(pool, jobs.exit_now, 3)
    assert exited.value.signal is None
    assert exited.value.exit_code == 3
    assert await call.run(pool, jobs.add, 4, 4) == 8
    assert len(call.usages) == 4
    assert not any(usage.killed for usage in call.usages)
    assert not alive(first)


async def test_cancelling_kills_the_group_and_the_next_call_gets_a_fresh_child(
    pool: ProcessPool, tmp_path: Path
) -> None:
    """A cancelled run kills the child and the grandchild it started, reaped within bounds."""
    call = Call()
    marker = tmp_path / "started"
    async with anyio.create_task_group() as group:
        group.start_soon(call.run, pool, jobs.spin_with_grandchild, str(marker))
        child, grandchild = (int(pid) for pid in (await marked(marker)).split())
        cancelled = time.monotonic()
        group.cancel_scope.cancel()
    stopped = time.monotonic() - cancelled
    assert stopped < 1.0
    assert not alive(child)
    assert not alive(grandchild)
    [usage] = call.usages
    assert usage.killed
    assert usage.pid == child
    assert usage.cpu_seconds > 0
    assert call.unfollowed == 1
    assert await call.run(pool, jobs.pid) not in {child, None}


async def test_lose_makes_checkpoint_raise_lease_lost(pool: ProcessPool, tmp_path: Path) -> None:
    """Mirror.lose() reaches the child through shared memory: its checkpoint() raises."""
    call = Call()
    marker = tmp_path / "started"
    async with anyio.create_task_group() as group:

        async def lose() -> None:
            await marked(marker)
            call.mirrors[0].lose("rejected")

        group.start_soon(lose)
        with pytest.raises(LeaseLost) as caught:
            await call.run(pool, jobs.until_lost, str(marker))
    assert caught.value.key == IDENTITY.job_key
    assert caught.value.fence == IDENTITY.fence
    assert caught.value.reason == "rejected"
    assert caught.value.stop_latency is not None
    assert not call.usages[0].killed


async def test_move_extends_the_deadline_the_child_sees(pool: ProcessPool, tmp_path: Path) -> None:
    """Mirror.move() pushes a renewal: remaining() grows, and the watchdog lets it run on."""
    call = Call()
    marker = tmp_path / "started"
    async with anyio.create_task_group() as group:

        async def move() -> None:
            await marked(marker)
            call.mirrors[0].move(time.monotonic() + 30.0)

        group.start_soon(move)
        left = await call.run(pool, jobs.until_moved, str(marker), 10.0, deadline=2.0)
    assert isinstance(left, float)
    assert 10.0 < left <= 30.0


async def test_a_call_that_starts_lost_raises_at_its_first_checkpoint(pool: ProcessPool) -> None:
    """run(lost=...) writes the loss before the call: the child never sees the lease owned."""
    with pytest.raises(LeaseLost, match="late"):
        await pool.run(
            jobs.lost_at_once,
            (),
            {},
            identity=IDENTITY,
            deadline=time.monotonic() + 10,
            lost="late",
            follow=Call().follow,
        )


async def test_aclose_during_a_call_kills_it_and_waits_for_its_reap(tmp_path: Path) -> None:
    """A call running while the pool closes ends ChildProcessDied; aclose returns after its reap."""
    marker = tmp_path / "started"
    call = Call()
    died: list[ChildProcessDied] = []
    pool = ProcessPool(1)

    async def run() -> None:
        try:
            await call.run(pool, jobs.spin, str(marker))
        except ChildProcessDied as exc:
            died.append(exc)

    async with anyio.create_task_group() as group:
        group.start_soon(run)
        child = int(await marked(marker))
        await pool.aclose()
        assert not alive(child)
        assert len(call.usages) == 1
    assert died[0].signal == signal.SIGKILL


async def test_a_cancelled_aclose_still_closes_the_keeper(tmp_path: Path) -> None:
    """A cancelled ``aclose`` (waiting for a running call's reap) still reaps the keeper.

    Left to the garbage collector, its pipe was an unclosed file and it a zombie.
    """
    marker = tmp_path / "started"
    call = Call()
    pool = ProcessPool(1)
    before = _keepers()

    async def run() -> None:
        with pytest.raises(ChildProcessDied):
            await call.run(pool, jobs.spin, str(marker))

    async with anyio.create_task_group() as group:
        group.start_soon(run)
        child = int(await marked(marker))
        [keeper] = _keepers() - before
        with anyio.CancelScope() as scope:
            scope.cancel()
            await pool.aclose()
        assert scope.cancelled_caught
        assert _reaped(keeper)
    assert not alive(child)


def _reaped(pid: int) -> bool:
    """Whether ``pid`` is gone, not even a zombie."""
    return not Path(f"/proc/{pid}").exists()


def _keepers() -> set[int]:
    """Return the pids of the pool keepers this process started and has not reaped."""
    return {pid for pid, line in child_commands(os.getpid()).items() if "_keeper.py" in line}


async def test_a_worker_that_died_idle_is_not_handed_a_call(pool: ProcessPool) -> None:
    """An idle child killed from outside is replaced; the next call runs, on the new child."""
    call = Call()
    first = await call.run(pool, jobs.pid)
    assert isinstance(first, int)
    exits = os.pidfd_open(first)  # readable once every thread of it exited, as the pool sees
    try:
        os.kill(first, signal.SIGKILL)
        with anyio.fail_after(5):
            await anyio.wait_readable(exits)
    finally:
        os.close(exits)
    assert await call.run(pool, jobs.pid) not in {first, None}


async def test_a_call_larger_than_the_pipe_is_sent_whole(pool: ProcessPool) -> None:
    """A 4 MiB argument fills the call's pipe many times over: the pod waits and writes on."""
    big = b"x" * (4 << 20)
    assert await Call().run(pool, jobs.add, big, b"y") == big + b"y"


async def test_a_plain_function_crosses_as_a_kept_reference_a_partial_whole(
    pool: ProcessPool,
) -> None:
    """A module-level function is pickled once and its reference kept; a partial each call.

    The partial's bound argument may change between calls (it is pickled with
    them), so it is never kept; both return what they compute, and the
    second call's context is the second execution's, not the first one's kept.
    """
    call = Call()
    assert await call.run(pool, jobs.add, 1, 2) == 3
    assert _pool._REFERENCES[jobs.add] == pickle.dumps(jobs.add, protocol=pickle.HIGHEST_PROTOCOL)
    part = functools.partial(jobs.add, b=10)
    assert await call.run(pool, part, 1) == 11
    part.keywords["b"] = 20
    assert await call.run(pool, part, 1) == 21
    assert part not in _pool._REFERENCES
    other = Identity(job_key="other", execution_id="e-2", fence=9)
    seen = await pool.run(
        jobs.identity, (), {}, identity=other, deadline=time.monotonic() + 60, follow=call.follow
    )
    assert seen[:3] == ("other", "e-2", 9)


async def test_a_call_refused_by_every_worker_it_tries_fails_instead_of_looping(
    pool: ProcessPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers that keep refusing a call (gone before it reached them) end it with an error.

    A pool of one tries its worker and the one started in its place, then raises
    ``ChildProcessDied``; each refusing worker is replaced.
    """
    tried: list[int] = []

    async def refuse(self: PoolWorker, data: bytes) -> bytes | None:
        tried.append(self.pid)
        raise NotTaken(self.pid)

    monkeypatch.setattr(PoolWorker, "call", refuse)
    with pytest.raises(ChildProcessDied):
        await Call().run(pool, jobs.pid)
    assert len(tried) == 2
    assert len(set(tried)) == 2
    monkeypatch.undo()
    assert await Call().run(pool, jobs.pid) not in tried


def test_a_pool_serves_one_event_loop_after_another() -> None:
    """A pool used from a second loop, after the first closed, gets its replies there.

    Each worker's reply pipe stays registered with the loop that used it last; the
    next loop takes it over. The call sleeps, so its reply is awaited, not found.
    """
    pool = ProcessPool(1)
    call = Call()

    async def one(a: int) -> object:
        with anyio.fail_after(10):
            return await call.run(pool, jobs.sleep_then_add, 0.05, a, 1)

    try:
        assert anyio.run(one, 1) == 2
        assert anyio.run(one, 2) == 3
    finally:
        anyio.run(pool.aclose)
    assert len({usage.pid for usage in call.usages}) == 1
