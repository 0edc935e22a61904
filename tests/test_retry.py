"""Retries: the one retry helper every loop uses, with the sleep injected (no real waits)."""

from __future__ import annotations

import random

import pytest

from leaseworker import Backoff
from leaseworker._retry import STARTUP, Retries, startup

pytestmark = pytest.mark.fake


class _Sleeps:
    """A stand-in sleep that records each wait and answers ``go_on`` (fake)."""

    def __init__(self, *, go_on: bool | None = None) -> None:
        self.waited: list[float] = []
        self.go_on = go_on

    async def __call__(self, seconds: float) -> bool | None:
        self.waited.append(seconds)
        return self.go_on


def _policy() -> Backoff:
    return Backoff(initial=0.25, cap=1.0, jitter=0, rng=random.Random(1))


async def test_each_wait_counts_a_try_logs_its_delay_and_sleeps_it() -> None:
    """The n-th wait sleeps the policy's n-th delay; the log hears (delay, tries so far)."""
    sleeps, logged = _Sleeps(), []
    retries = Retries(_policy(), sleep=sleeps)
    for _ in range(4):
        assert await retries.wait(lambda delay, count: logged.append((delay, count)))
    assert sleeps.waited == [0.25, 0.5, 1.0, 1.0]  # doubled, then capped
    assert logged == [(0.25, 1), (0.5, 2), (1.0, 3), (1.0, 4)]
    assert retries.count == 4


async def test_a_hint_shortens_the_wait_and_a_reset_starts_over() -> None:
    """A busy lease's remaining TTL bounds the delay; after a success delays start small."""
    sleeps = _Sleeps()
    retries = Retries(_policy(), sleep=sleeps)
    await retries.wait()
    await retries.wait(hint=0.1)
    retries.reset()
    await retries.wait()
    assert sleeps.waited == [0.25, 0.1, 0.25]


async def test_a_sleep_that_answers_false_stops_the_retries() -> None:
    """A stop during a start-up wait: the sleep answers ``False`` and so does ``wait``."""
    retries = Retries(_policy(), sleep=_Sleeps(go_on=False))
    assert not await retries.wait()
    assert retries.count == 1


def test_the_startup_policy_takes_the_pods_cap() -> None:
    """Start-up retries begin at 0.5 s like STARTUP and never wait longer than the cap."""
    policy = startup(3.0)
    assert (policy.initial, policy.cap) == (STARTUP.initial, 3.0)
    assert max(policy.delay(n) for n in range(20)) <= 3.0
