"""The local redis-server: started on a free port, stopped by PID, nothing left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from leaseworker._dev._services import LocalRedis


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
