"""hold() on MemoryLeases and virtual time: its schedule and its stops, to the exact moment.

The real-Redis tests (test_hold.py) show the behaviour against the real
store; these pin the timing itself, which a loaded machine cannot blur: the
renewal schedule, where each kind of loss stops the body, and ``max_runtime``.
Each test is a plain function running its scenario with ``run_in_virtual_time``.
"""

from __future__ import annotations

import anyio
import pytest

from leaseworker import Event, HeldLease, LeaseEvent, LeaseLost, LeaseTimeout, hold
from leaseworker.testing import MemoryLeases, RenewalFault, run_in_virtual_time, stall

LEASE, EVERY = 30.0, 10.0
DEADLINE = LEASE * 0.99 - 0.05  # 29.65 s after a request is sent, with the default policy


class _Events:
    """Lease events with their times."""

    def __init__(self) -> None:
        self.events: list[LeaseEvent] = []

    def __call__(self, event: Event) -> None:
        assert isinstance(event, LeaseEvent)
        self.events.append(event)

    def at(self, name: str) -> list[float]:
        return [event.at for event in self.events if event.name == name]


def test_renewals_run_every_interval_and_keep_the_deadline_ahead() -> None:
    """A 95 s body under a 30 s lease: renewals at 10, 20, ... 90 s, completed, released."""
    events = _Events()

    async def scenario() -> HeldLease:
        leases = MemoryLeases()
        async with hold(
            leases, "k", lease_duration=LEASE, renewal_interval=EVERY, hooks=[events]
        ) as held:
            await anyio.sleep(95)
            assert held.remaining() == pytest.approx(90 + DEADLINE - 95)
        return held

    held = run_in_virtual_time(scenario())
    assert events.at("renewed") == [10.0 * n for n in range(1, 10)]
    assert held.outcome == "completed"
    assert held.renewals == 9
    assert held.released is True


@pytest.mark.parametrize(
    ("how", "stopped_at"),
    [("rejected", 10.0), ("error", 10.0), ("timeout", 10.5), ("late", DEADLINE + 0.001)],
)
def test_a_failed_renewal_stops_the_body_at_once(how: RenewalFault, stopped_at: float) -> None:
    """The first renewal fails ``how``; the body's await is cancelled at that very moment."""
    stopped: list[float] = []

    async def scenario() -> LeaseLost:
        leases = MemoryLeases(command_timeout=0.5)
        leases.fail_renewals(how)
        with pytest.raises(LeaseLost) as lost:
            async with hold(leases, "k", lease_duration=LEASE, renewal_interval=EVERY):
                try:
                    await anyio.sleep_forever()
                finally:
                    stopped.append(anyio.current_time())
        return lost.value

    lost = run_in_virtual_time(scenario())
    assert lost.reason == how
    assert stopped == [pytest.approx(stopped_at)]
    assert lost.stop_latency == 0.0


def test_max_runtime_stops_a_healthy_body_at_exactly_its_bound() -> None:
    """Ten minutes under a 30 s lease: 59 renewals confirmed, then LeaseTimeout at 600 s."""

    async def scenario() -> tuple[HeldLease, float]:
        leases = MemoryLeases()
        with pytest.raises(LeaseTimeout):
            async with hold(
                leases, "k", lease_duration=LEASE, renewal_interval=EVERY, max_runtime=600
            ) as held:
                await anyio.sleep_forever()
        return held, anyio.current_time()

    held, ended = run_in_virtual_time(scenario())
    assert (held.outcome, ended, held.renewals) == ("timed_out", 600.0, 59)


@pytest.mark.parametrize("renewed_first", [False, True])
def test_a_stall_past_the_deadline_stops_the_body_at_its_next_await(renewed_first: bool) -> None:
    """A 40 s blocked loop, before or after the first renewal: lost at the next await."""
    reached: list[bool] = []

    async def scenario() -> LeaseLost:
        leases = MemoryLeases()
        with pytest.raises(LeaseLost) as lost:
            async with hold(leases, "k", lease_duration=LEASE, renewal_interval=EVERY) as held:
                if renewed_first:
                    await anyio.sleep(EVERY + 1)
                    assert held.renewals == 1
                stall(40.0)
                await held.checkpoint()
                reached.append(True)
        return lost.value

    lost = run_in_virtual_time(scenario())
    assert reached == []
    assert lost.reason in {"deadline", "loop_blocked"}
    began, deadline = (EVERY + 1, EVERY + DEADLINE) if renewed_first else (0.0, DEADLINE)
    assert lost.stop_latency == pytest.approx(began + 40.0 - deadline)


def test_a_key_taken_meanwhile_is_found_at_the_next_renewal() -> None:
    """Another pod takes the key at 25 s: the 30 s renewal is rejected, the taker keeps it."""

    async def scenario() -> tuple[LeaseLost, float, str]:
        leases = MemoryLeases()
        with pytest.raises(LeaseLost) as lost:
            async with hold(leases, "k", lease_duration=LEASE, renewal_interval=EVERY):
                await anyio.sleep(25)
                taker = leases.take("k", LEASE)
                await anyio.sleep_forever()
        return lost.value, anyio.current_time(), taker.owner

    lost, ended, taker = run_in_virtual_time(scenario())
    assert (lost.reason, ended) == ("rejected", 30.0)
    assert taker.startswith("another-pod:")


def test_leases_due_in_one_slot_renew_together_never_late() -> None:
    """Acquired 10 ms apart, two leases renew together at the first one's due time.

    The clock's slots are ``renewal_interval / 16`` wide, at most 50 ms: B,
    due at 10.02 s, goes with A at 10.01 s (10 ms early, never late), and the
    two stay together from then on.
    """
    a_events, b_events = _Events(), _Events()

    async def scenario() -> None:
        leases = MemoryLeases()

        async def one(start: float, events: _Events) -> None:
            await anyio.sleep(start)
            async with hold(
                leases, f"k{start}", lease_duration=LEASE, renewal_interval=EVERY, hooks=[events]
            ):
                await anyio.sleep(35)

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, 10.01 - EVERY, a_events)
            tg.start_soon(one, 10.02 - EVERY, b_events)

    run_in_virtual_time(scenario())
    together = [pytest.approx(10.01 + EVERY * n) for n in range(3)]
    assert a_events.at("renewed") == together
    assert b_events.at("renewed") == together
