"""VirtualTimeLoop: sleeps cost nothing, times are exact, I/O and threads still work."""

from __future__ import annotations

import asyncio
import time

import anyio
import pytest

from leaseworker.testing import VirtualTimeLoop, run_in_virtual_time, stall


async def test_this_directory_runs_on_virtual_time() -> None:
    """The conftest hook gives every async test here a virtual loop starting at 0."""
    assert isinstance(asyncio.get_running_loop(), VirtualTimeLoop)


async def test_timers_fire_at_their_exact_times_in_order() -> None:
    """Concurrent sleeps of 10 min, 10 s and 30 s end at exactly those times, in order."""
    woke: list[tuple[float, float]] = []

    async def sleeper(seconds: float) -> None:
        await anyio.sleep(seconds)
        woke.append((seconds, anyio.current_time()))

    begun = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for seconds in (600.0, 10.0, 30.0):
            tg.start_soon(sleeper, seconds)
    assert woke == [(10.0, 10.0), (30.0, 30.0), (600.0, 600.0)]
    assert time.perf_counter() - begun < 5  # virtual: no real wait (slack for a loaded CI)


async def test_a_deadline_cancels_at_its_exact_time() -> None:
    """Cancel scopes (hold()'s deadlines) are on the same clock: exact too."""
    with anyio.move_on_after(29.65) as scope:
        await anyio.sleep_forever()
    assert scope.cancelled_caught
    assert anyio.current_time() == 29.65


async def test_jump_moves_time_without_running_anything() -> None:
    """A jump is a blocked loop: a timer due meanwhile fires only afterwards, late."""
    fired: list[float] = []
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualTimeLoop)

    def fire() -> None:
        fired.append(loop.time())
        done.set()

    loop.call_later(1.0, fire)
    stall(5.0)
    assert fired == []
    await done.wait()
    assert fired == [5.0]
    with pytest.raises(ValueError, match="forward"):
        loop.jump(-1)


async def test_a_thread_still_wakes_the_loop() -> None:
    """With no timer pending the loop waits for real I/O: a thread's result arrives."""
    assert await anyio.to_thread.run_sync(lambda: 42) == 42


def test_run_in_virtual_time_starts_where_it_is_told() -> None:
    """The sync entry point returns the coroutine's value; the clock starts at ``start``."""

    async def main() -> float:
        await anyio.sleep(3)
        return anyio.current_time()

    assert run_in_virtual_time(main(), start=100.0) == 103.0


def test_stall_on_a_real_loop_blocks_for_real() -> None:
    """Off virtual time a stall is a real, blocking sleep (nothing else runs)."""

    async def main() -> float:
        begun = time.monotonic()
        stall(0.05)
        return time.monotonic() - begun

    assert asyncio.run(main()) >= 0.05
