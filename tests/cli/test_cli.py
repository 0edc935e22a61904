"""The ``leaseworker`` command line: version, help, usage errors, inspect."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from leaseworker import __version__
from leaseworker._cli import main
from leaseworker._cli._common import env_name
from leaseworker_dev._services import LocalRedis


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "leaseworker._cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_version_and_help() -> None:
    """``--version`` prints the package version; ``--help`` lists the subcommands."""
    version = _run("--version")
    assert version.returncode == 0
    assert version.stdout.strip() == f"leaseworker {__version__}"
    helptext = _run("--help")
    assert helptext.returncode == 0
    assert "demo" in helptext.stdout
    assert "inspect" in helptext.stdout


def test_unknown_flag_exits_2_with_a_reason() -> None:
    """Bad usage is exit code 2 and a one-line reason on stderr."""
    result = _run("inspect", "k", "--no-such-flag")
    assert result.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in result.stderr


@pytest.mark.fake
def test_flags_map_to_leaseworker_env_vars() -> None:
    """Pure check of the flag -> environment variable naming."""
    assert env_name("--redis-url") == "LEASEWORKER_REDIS_URL"
    assert env_name("--shutdown-timeout") == "LEASEWORKER_SHUTDOWN_TIMEOUT"


def test_inspect_prints_owner_ttl_and_fence_as_json(
    redis_server: LocalRedis,
    capsys: pytest.CaptureFixture[str],
    namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    """``leaseworker inspect`` reads a real Redis; an unheld, never-completed key shows nulls."""
    store = f"sqlite:///{tmp_path / 'completions.sqlite3'}"
    code = main(
        [
            "inspect",
            "report:x",
            "--redis-url",
            redis_server.url,
            "--namespace",
            namespace,
            "--store-url",
            store,
        ]
    )
    assert code == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown == {
        "key": "report:x",
        "owner": None,
        "ttl": None,
        "fence": None,
        "completion": None,
        "effects": [],
    }
