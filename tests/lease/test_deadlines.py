"""DeadlineWheel: shared-timer call timeouts that keep asyncio.timeout's cancel protocol.

Pure unit tests of the timing logic on a real asyncio loop; no services.
"""

from __future__ import annotations

import asyncio

import anyio
import pytest

from leaseworker._lease._deadlines import DeadlineWheel


async def test_a_call_that_outlives_the_timeout_is_cut_off_at_most_a_tick_early() -> None:
    """The call raises TimeoutError, not before timeout - tick, and no cancel leaks."""
    wheel = DeadlineWheel(0.2, resolution=4)
    never = asyncio.Event()
    begun = anyio.current_time()
    with pytest.raises(TimeoutError):
        await wheel.run(never.wait())
    waited = anyio.current_time() - begun
    assert waited >= 0.2 - wheel.tick
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_a_call_that_finishes_in_time_returns_and_is_never_cancelled_later() -> None:
    """Leaving the slot early means its timer never touches the task afterwards."""
    wheel = DeadlineWheel(0.05, resolution=2)
    assert await wheel.run(asyncio.sleep(0, result="done")) == "done"
    # Outlive the slot the call was filed under: its timer must not touch this task.
    # Deterministic, not a guess: the loop runs timers in deadline order, so the
    # slot's (at most 0.05 s + a tick) fires before this sleep's wakes.
    await asyncio.sleep(0.1)
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_many_concurrent_calls_each_time_out_or_finish_on_their_own() -> None:
    """Calls sharing slots are cut off individually: only the ones still waiting."""
    wheel = DeadlineWheel(0.2, resolution=8)
    release = asyncio.Event()
    outcomes: dict[int, str] = {}

    async def call(i: int) -> None:
        try:
            await wheel.run(release.wait() if i % 2 else asyncio.sleep(0))
            outcomes[i] = "finished"
        except TimeoutError:
            outcomes[i] = "timed out"

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(call, i)
    assert outcomes == {i: "timed out" if i % 2 else "finished" for i in range(20)}


async def test_an_outer_cancel_scope_is_not_mistaken_for_a_timeout() -> None:
    """An anyio scope cancelling a bounded call is caught by that scope, as a cancel."""
    wheel = DeadlineWheel(5.0)
    waiting = asyncio.Event()

    async def parked() -> None:
        waiting.set()
        await asyncio.Event().wait()

    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(wheel.run, parked())
            await waiting.wait()
            scope.cancel()
    assert scope.cancelled_caught


async def test_an_outer_cancel_arriving_with_the_timeout_wins() -> None:
    """A cancel requested while the wheel's cut-off unwinds stays a cancel."""
    wheel = DeadlineWheel(0.05, resolution=2)

    async def cancelled_again_while_timing_out() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            task.cancel()  # someone else cancels the task before the wheel sees it
            raise

    task = asyncio.create_task(wheel.run(cancelled_again_while_timing_out()))
    await asyncio.wait([task])
    assert task.cancelled()  # not TimeoutError: the outer request is honoured


async def test_a_call_that_swallows_the_cut_off_leaves_no_cancel_request_behind() -> None:
    """An awaitable that eats the cancellation returns, and the request is withdrawn."""
    wheel = DeadlineWheel(0.05, resolution=2)

    async def stubborn() -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return "swallowed"
        return "unreachable"

    assert await wheel.run(stubborn()) == "swallowed"
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


def test_a_wheel_keeps_working_on_a_new_event_loop() -> None:
    """Slots from a finished loop do not confuse the next one."""
    wheel = DeadlineWheel(0.05, resolution=2)

    async def once() -> None:
        with pytest.raises(TimeoutError):
            await wheel.run(asyncio.Event().wait())

    asyncio.run(once())
    asyncio.run(once())


def test_bad_settings_are_rejected() -> None:
    """A zero timeout or resolution is a programming error."""
    with pytest.raises(ValueError, match="timeout > 0"):
        DeadlineWheel(0)
    with pytest.raises(ValueError, match="resolution >= 1"):
        DeadlineWheel(1.0, resolution=0)
