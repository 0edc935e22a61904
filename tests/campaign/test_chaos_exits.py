"""``leaseworker chaos`` stopped by a signal mid-campaign: exit 130, nothing left behind.

The campaign runs with a private ``TMPDIR`` (the processes it starts are read
from /proc, see ``tests/processes.py``); SIGTERM arrives while the faults
play. The campaign ends its faults and triggers, stops its pods and services
and removes its scratch directory, without a verdict.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..processes import Spawned, alive, ended, start, stop_all

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def commands() -> Iterator[list[Spawned]]:
    """Campaigns started by the test; whatever a failing test left running is stopped."""
    started: list[Spawned] = []
    yield started
    stop_all(started)


@pytest.mark.timeout(240)
def test_sigterm_mid_campaign_stops_the_pods_and_services_and_leaves_nothing(
    commands: list[Spawned], tmp_path: Path
) -> None:
    """Two pods on one Redis, faults playing: SIGTERM ends the campaign at once, 130."""
    one = start(
        commands,
        tmp_path,
        *("chaos", "chaos_job:ShortLeaseReport", "--faults", "40", "--seed", "3"),
        *("--pods", "2", "--store-url", f"sqlite:///{tmp_path / 'store.db'}"),
        cwd=BENCH,
    )
    one.wait_for("playing 40 faults", within=180)
    started = one.children()
    assert len(started) >= 4  # two pods, redis-server, Kafka
    one.process.send_signal(signal.SIGTERM)
    assert ended(one) == 130, one.seen
    assert any("SIGTERM: stopping the campaign" in line for line in one.seen)
    assert not any("draining" in line for line in one.seen)
    assert not alive(started)
    assert not list(one.tmp.iterdir())
