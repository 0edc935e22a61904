"""The local redis-server: started on a free port, stopped by PID, nothing left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis

from leaseworker_dev._services import LocalRedis, WallClock


def test_stop_ends_the_process_and_removes_its_temporary_directory() -> None:
    """A server started without a work directory removes the one it made."""
    server = LocalRedis.start()
    assert server.workdir.is_dir()
    server.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(server.process.pid, 0)
    assert not server.workdir.exists()


def test_a_work_directory_given_by_the_caller_is_kept(tmp_path: Path) -> None:
    """The caller's directory stays: it is the caller's to remove."""
    server = LocalRedis.start(workdir=tmp_path)
    server.stop()
    assert (tmp_path / "redis.log").exists()


def test_a_restart_with_data_keeps_keys_and_their_ttl_and_an_empty_one_does_not() -> None:
    """restart_with_data: the lease key and its TTL are back; restart_empty then forgets them."""
    server = LocalRedis.start()
    try:
        client = redis.Redis(port=server.port)
        client.set("lease", "owner", px=60_000)
        client.close()
        server.restart_with_data()
        client = redis.Redis(port=server.port)
        assert client.get("lease") == b"owner"
        assert 0 < client.pttl("lease") <= 60_000
        client.close()
        server.restart_empty()
        client = redis.Redis(port=server.port)
        assert client.get("lease") is None
        client.close()
    finally:
        server.stop()


def test_a_server_on_a_wall_clock_sees_each_step_at_once(tmp_path: Path) -> None:
    """TIME follows the steps while the server runs, and key expiry reads the same clock.

    +5 s expires a 3 s key at once; -10 s then puts the server 5 s behind.
    """
    clock = WallClock.create(tmp_path)
    server = LocalRedis.start(workdir=tmp_path / "redis", clock=clock)
    try:
        client = redis.Redis(port=server.port)
        before = _seconds(client.time())
        client.set("lease", "owner", px=3_000)
        clock.step(5)
        assert _seconds(client.time()) - before == pytest.approx(5, abs=0.5)
        assert client.get("lease") is None
        clock.step(-10)
        assert _seconds(client.time()) - before == pytest.approx(-5, abs=0.5)
        assert clock.shift == -5
        client.close()
    finally:
        server.stop()


def _seconds(time: tuple[int, int]) -> float:
    return time[0] + time[1] / 1e6
