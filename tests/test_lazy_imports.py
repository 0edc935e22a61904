"""Nothing loads until used: each check imports in a fresh interpreter and reads sys.modules.

A pytest session of everyone who installs leaseworker loads the plugin, and a
user's ``import leaseworker`` should not pay for the tooling (demos, campaign,
timeline, CLI) either; the CLI imports only the subcommand it runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from leaseworker._cli._main import COMMANDS, command_module

TOOLING = (
    "leaseworker_dev._services",
    "leaseworker_dev._demos",
    "leaseworker_dev._campaign",
    "leaseworker_dev._cli",
    "leaseworker._timeline",
    "leaseworker._cli",
)


def run(code: str) -> Any:
    """Run ``code`` in a fresh interpreter; return the JSON its last line printed."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout.splitlines()[-1])


def loaded(code: str, *prefixes: str) -> list[str]:
    """Run ``code`` in a fresh interpreter; return the loaded modules under ``prefixes``."""
    found: list[str] = run(
        textwrap.dedent(code)
        + textwrap.dedent(
            f"""
            import json, sys
            print(json.dumps(sorted(
                m for m in sys.modules
                if any(m == p or m.startswith(p + ".") for p in {prefixes!r})
            )))
            """
        )
    )
    return found


def test_the_pytest_plugin_loads_no_tooling_and_no_aiokafka() -> None:
    """Loading the ``pytest11`` plugin imports no tooling package and no aiokafka.

    Its fixtures import the dev services when a test asks for one.
    """
    assert loaded("import leaseworker_dev.pytest_plugin", *TOOLING, "aiokafka") == []


def test_the_plugin_still_offers_the_embedded_pod_by_name() -> None:
    """``PodFactory`` (what tests annotate ``leaseworker_pod`` with) loads on first use."""
    code = "from leaseworker_dev.pytest_plugin import PodFactory, EmbeddedPod"
    assert "leaseworker._worker" in loaded(code, "leaseworker._worker")


def test_import_leaseworker_loads_no_tooling_and_no_aiokafka() -> None:
    """The library's top level loads no tooling package; its Kafka-bound names load on use."""
    assert loaded("import leaseworker, leaseworker.testing", *TOOLING, "aiokafka") == []
    assert "aiokafka" in loaded("from leaseworker import Pod", "aiokafka")


def test_import_leaseworker_loads_no_opentelemetry_sdk_and_no_redis() -> None:
    """``import leaseworker`` (and the testing kit, and its plugin) loads neither.

    redis-py 8.1 imports the OpenTelemetry SDK itself (``redis.observability.providers``
    via ``redis.maint_notifications``), so the Redis-bound names load on first use;
    the SDK is installed here and nothing blocks it, so this reads what really loads.
    """
    for code in ("import leaseworker", "import leaseworker_dev.pytest_plugin"):
        assert loaded(code, "opentelemetry.sdk", "redis") == [], code
    assert "redis" in loaded("from leaseworker import RedisLeases", "redis")
    assert "redis" in loaded("from leaseworker import redis_from_url", "redis")


def test_the_store_loads_psycopg_only_for_a_postgresql_url() -> None:
    """The PostgreSQL store loads psycopg (the ``postgres`` extra); nothing before it does.

    Neither ``import leaseworker`` nor opening a SQLite or ``memory://`` store
    imports it: a pod without the extra runs on them.
    """
    code = """
        import anyio, leaseworker

        async def main() -> None:
            for url in ("memory://", "sqlite:///:memory:"):
                async with leaseworker.open_store(url):
                    pass

        anyio.run(main)
    """
    assert loaded(code, "psycopg", "leaseworker._store._postgres") == []
    assert "psycopg" in loaded("import leaseworker._store._postgres", "psycopg")


@pytest.mark.parametrize(
    ("argv", "command", "tooling"),
    [
        (["--help"], None, set()),
        (["demo", "--help"], "demo", set()),
        (["chaos", "--help"], "chaos", set()),
        (["timeline", "--help"], "timeline", {"leaseworker._timeline"}),
        (["--log-level", "DEBUG", "topics", "--help"], "topics", set()),
    ],
)
def test_the_cli_imports_only_the_subcommand_it_runs(
    argv: list[str], command: str | None, tooling: set[str]
) -> None:
    """``leaseworker <command>`` imports that command's module and no other subcommand's.

    Of the tooling packages it loads only those the command uses.
    """
    code = f"""
        from leaseworker._cli import main
        try:
            main({argv!r})
        except SystemExit:
            pass
    """
    found = set(loaded(code, *TOOLING))
    subcommands = {command_module(name) for name in COMMANDS}
    assert found & subcommands == ({command_module(command)} if command else set())
    clis = {"leaseworker._cli", "leaseworker_dev._cli"}
    assert {m for m in found if m.count(".") == 1} - clis == tooling
