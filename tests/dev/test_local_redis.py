"""The local redis-server: started on a free port, stopped by PID, nothing left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis

from leaseworker_dev._services import LocalRedis


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
