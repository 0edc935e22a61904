"""Units of the health endpoints: the lag arithmetic, the readiness rules, the HTTP server."""

from __future__ import annotations

import time

import anyio
import pytest

from leaseworker import ConfigError
from leaseworker._kafka import SourceStats
from leaseworker._worker import HealthServer
from leaseworker._worker._health import PodHealth, RedisProbe, json_response
from leaseworker._worker._looplag import LoopLagMonitor

from ..health_util import probe


def test_a_reader_sees_the_ongoing_stall_without_help_from_the_loop() -> None:
    """read(now) reports now - last wake - interval, even if the monitor never ran again."""
    monitor = LoopLagMonitor(interval=0.25, stall_threshold=1.0)
    woke = monitor._woke
    assert monitor.read(now=woke + 0.1).current == 0.0
    lag = monitor.read(now=woke + 0.25 + 3.0)
    assert lag.current == pytest.approx(3.0)
    assert lag.max == pytest.approx(3.0)
    assert lag.stalls == 0  # counted by the loop once it measures the stall itself


def test_measured_lags_count_stalls_above_the_threshold_only() -> None:
    """A recorded lag above the threshold is a stall; the maximum is kept after recovery."""
    monitor = LoopLagMonitor(interval=0.25, stall_threshold=1.0)
    monitor._record(0.5)
    monitor._record(2.0)
    monitor._record(-0.001)  # clock granularity: never a negative lag
    lag = monitor.read(now=monitor._woke)
    assert (lag.current, lag.max, lag.stalls) == (0.0, 2.0, 1)


async def test_loop_lag_monitor_measures_a_blocked_loop() -> None:
    """A synchronous sleep on the loop shows up as a recorded lag of about that length."""
    monitor = LoopLagMonitor(interval=0.01, stall_threshold=0.1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(monitor.run)
        await anyio.lowlevel.checkpoint()  # the monitor runs up to its first sleep
        time.sleep(0.3)  # noqa: ASYNC251 - blocking the loop is the point
        with anyio.fail_after(5):  # until the monitor has woken and recorded it
            while monitor.read().stalls < 1:  # noqa: ASYNC110 - a plain counter
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    lag = monitor.read()
    assert lag.max >= 0.25
    assert lag.stalls >= 1  # this one (a busy CI machine may add its own)


@pytest.mark.fake
async def test_readiness_needs_a_joined_group_and_a_fresh_redis_answer() -> None:
    """Fake PING: ready only when joined (assigned or idle) and the last PING is fresh."""
    failing = True

    async def ping() -> None:
        if failing:
            raise ConnectionError("refused")

    stats = SourceStats()
    redis = RedisProbe(ping, stale_after=60)
    health = PodHealth(
        pod="p", monitor=LoopLagMonitor(), redis=redis, kafka=stats, stall_threshold=10
    )
    await redis.probe()
    assert health.readyz().status == 503
    failing = False
    await redis.probe()
    for membership, status in [
        ("joining", 503),
        ("assigned", 200),
        ("rebalancing", 503),
        ("idle", 200),
        ("stopping", 503),
    ]:
        stats.membership = membership
        assert health.readyz().status == status, membership
    redis.stale_after = -1.0  # any answer is now too old
    response = health.readyz()
    assert response.status == 503
    assert b"no redis answer for" in response.body


async def test_server_answers_routes_404s_unknown_paths_and_survives_a_broken_route() -> None:
    """Registered paths answer (query ignored), others get 404, a raising route gets 500."""
    server = HealthServer("127.0.0.1", 0)

    def broken() -> None:
        raise RuntimeError("boom")

    server.route("/ok", lambda: json_response(200, {"fine": True}))
    server.route("/broken", broken)  # type: ignore[arg-type]
    server.start()
    try:
        assert await probe(server.port, "/ok?verbose=1") == (200, {"fine": True})
        assert (await probe(server.port, "/missing"))[0] == 404
        assert await probe(server.port, "/broken") == (500, {"error": "RuntimeError"})
        assert (await probe(server.port, "/ok"))[0] == 200  # still serving
    finally:
        server.close()


def test_a_taken_port_is_a_config_error() -> None:
    """Binding a port already in use fails at once with ConfigError, not later in a thread."""
    first = HealthServer("127.0.0.1", 0)
    try:
        with pytest.raises(ConfigError, match="cannot listen"):
            HealthServer("127.0.0.1", first.port)
    finally:
        first.close()
