"""The one stack builder's bookkeeping, with stand-in services (no process starts).

Whatever came up is stopped, newest first, also when another start failed;
a service starts at most once, even when asked for from several threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from leaseworker_dev._services import LocalStack, Service

pytestmark = pytest.mark.fake


class StandIn:
    """A service that records its stop into ``stopped``."""

    def __init__(self, name: str, stopped: list[str]) -> None:
        self.name = name
        self._stopped = stopped

    def stop(self) -> None:
        """Record the stop (Redis's then fails)."""
        self._stopped.append(self.name)
        if self.name == "redis":
            raise RuntimeError("a stop that fails does not keep the others running")


def starters(
    stopped: list[str], started: list[str], failing: dict[str, BaseException] | None = None
) -> dict[Service, Callable[[], Any]]:
    """Stand-in starters for every service; ``failing`` ones raise instead."""

    def starter(name: str) -> Callable[[], Any]:
        def start() -> StandIn:
            if failing and name in failing:
                raise failing[name]
            started.append(name)
            return StandIn(name, stopped)

        return start

    names: list[Service] = ["redis", "sentinel", "cluster", "kafka", "postgres", "jaeger"]
    return {name: starter(name) for name in names}


def test_a_failed_start_raises_after_the_others_came_up_and_they_are_stopped() -> None:
    """Kafka fails; Redis and PostgreSQL started beside it are still stopped by ``stop``."""
    stopped: list[str] = []
    stack = LocalStack(starters(stopped, [], {"kafka": RuntimeError("no java")}))
    with pytest.raises(RuntimeError, match="no java"), stack:
        stack.start("redis", "kafka", "postgres")
    assert sorted(stopped) == ["postgres", "redis"]
    assert stack.get("redis") is None  # stopped services are forgotten


def test_an_optional_service_that_is_not_installed_stays_off() -> None:
    """PostgreSQL missing (``FileNotFoundError``) is no error when it was optional."""
    stopped: list[str] = []
    with LocalStack(starters(stopped, [], {"postgres": FileNotFoundError("initdb")})) as stack:
        stack.start("kafka", optional=["postgres"])
        assert stack.get("postgres") is None
        assert stack.get("kafka") is not None
    assert stopped == ["kafka"]


def test_stop_goes_newest_first_and_past_a_failing_stop() -> None:
    """Services stop in the reverse order they started; Redis's failing stop skips nothing."""
    stopped: list[str] = []
    with LocalStack(starters(stopped, [])) as stack:
        stack.start("redis")
        stack.start("kafka")
        assert stack.postgres is not None  # a property starts its service on first use
    assert stopped == ["postgres", "kafka", "redis"]


def test_a_service_starts_once_when_many_threads_ask_for_it() -> None:
    """Eight threads asking for Kafka at once get one broker."""
    stopped: list[str] = []
    started: list[str] = []
    with LocalStack(starters(stopped, started)) as stack:
        seen: list[object] = []
        threads = [threading.Thread(target=lambda: seen.append(stack.kafka)) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert started == ["kafka"]
        assert len({id(s) for s in seen}) == 1
