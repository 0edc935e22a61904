"""The pytest plugin as users get it: loaded from its entry point, services stopped by PID."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

USER_TESTS = """
import json, os

def test_one(leaseworker_redis):
    with open(os.environ["LW_SEEN"], "a") as seen:
        seen.write(json.dumps([leaseworker_redis.process.pid, str(leaseworker_redis.workdir)]))
        seen.write("\\n")

def test_two(leaseworker_redis):
    test_one(leaseworker_redis)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_session_redis_starts_once_and_is_stopped_by_pid(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two tests share one redis-server; after the run its process and directory are gone."""
    seen = tmp_path / "seen.jsonl"
    monkeypatch.setenv("LW_SEEN", str(seen))
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    runs = [json.loads(line) for line in seen.read_text().splitlines()]
    assert len(runs) == 2
    assert runs[0] == runs[1]  # one server for the session
    pid, workdir = runs[0]
    assert not _alive(pid)
    assert not Path(workdir).exists()
