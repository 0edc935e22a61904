"""``leaseworker run`` start-up: what waiting cannot fix exits 2 with one line (real services).

Each pod here would, before these checks, have retried forever (wrong Redis
credentials, an SQLite directory that does not exist, a missing topic) or
failed only at its first export (an OTLP endpoint that is not a URL).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from leaseworker import ConfigError
from leaseworker._cli._run_command import setting_error
from leaseworker_dev._services import LocalKafka, LocalRedis

from ..kafka_util import KafkaNames
from ..pods import LEASEWORKER, REPO

JOB = "tests.jobs:MarkerJob"


def _run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``leaseworker run ... JOB`` to its end (bounded), capturing its output."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [LEASEWORKER, *argv],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def _exit_line(result: subprocess.CompletedProcess[str]) -> str:
    """Check the run exited 2 without a traceback; return its last line."""
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        (["--store-url", "postgresql://lw:pw@db:notaport/r"], "port 'notaport' is not a port"),
        (["--store-url", "postgresql://lw:pw@db/r?sslmode=bogus"], "sslmode='bogus' is not one"),
        (["--otlp-endpoint", "notaurl"], "'notaurl' is not an OTLP/HTTP endpoint"),
        (["--otlp-endpoint", "http://collector:port"], "is not an OTLP/HTTP endpoint"),
    ],
)
def test_settings_libraries_would_refuse_only_later_exit_2_at_once(
    flags: list[str], reason: str
) -> None:
    """Libpq reads a port or sslmode only when it connects; an exporter its URL at export."""
    line = _exit_line(_run("run", *flags, JOB))
    assert line.startswith("leaseworker run: error: ")
    assert reason in line
    assert "pw@" not in line


def test_a_top_level_flag_after_the_subcommand_gets_a_hint() -> None:
    """``run X --log-level DEBUG``: argparse alone says only "unrecognized arguments"."""
    line = _exit_line(_run("run", JOB, "--log-level", "DEBUG"))
    assert "unrecognized arguments: --log-level DEBUG" in line
    assert "--log-level goes before the command: leaseworker --log-level ... run ..." in line


def test_redis_refusing_the_credentials_exits_2_naming_redis_not_the_password(
    redis_server: LocalRedis,
) -> None:
    """AuthenticationError does not heal by waiting; the line names the host, never the password."""
    url = f"redis://nobody:wrong-secret@127.0.0.1:{redis_server.port}/0"
    result = _run("--log-level", "INFO", "run", "--redis-url", url, "--store-url", "memory://", JOB)
    line = _exit_line(result)
    assert f"Redis at 127.0.0.1:{redis_server.port} refused the credentials" in line
    assert f"Redis 127.0.0.1:{redis_server.port}, store memory://" in result.stderr  # start line
    assert "wrong-secret" not in result.stderr


def test_an_sqlite_store_in_a_directory_that_does_not_exist_exits_2(
    redis_server: LocalRedis,
) -> None:
    """The directory will not appear by retrying: one line names it."""
    result = _run(
        "run", "--redis-url", redis_server.url, "--store-url", "sqlite:///nonexistent/dir/x.db", JOB
    )
    line = _exit_line(result)
    assert "cannot open sqlite:///nonexistent/dir/x.db" in line
    assert "nonexistent/dir does not exist" in line


def test_a_missing_dead_letter_topic_exits_2_in_a_few_lines(
    kafka_server: LocalKafka, redis_server: LocalRedis, kafka_names: KafkaNames
) -> None:
    """The job topic exists, the dead-letter topic does not, and the broker does not create it.

    Before the check: a ready pod, 443 aiokafka lines in 50 s and a partition
    that stopped committing at the first dead letter.
    """
    kafka_server.create_topics([kafka_names.topic])
    result = _run(
        "--log-level",
        "INFO",
        "run",
        "--bootstrap-servers",
        kafka_server.bootstrap_servers,
        "--redis-url",
        redis_server.url,
        "--store-url",
        "memory://",
        "--group",
        kafka_names.group,
        "--dead-letter-topic",
        "no.such.dlq",
        JOB,
        env={"LW_TEST_TOPIC": kafka_names.topic},
    )
    line = _exit_line(result)
    assert "topic 'no.such.dlq' not found on Kafka" in line
    assert "auto.create.topics.enable=false" in line
    lines = result.stderr.strip().splitlines()
    assert len(lines) <= 8, "\n".join(lines)
    assert not [text for text in lines if " ERROR " in text or " WARNING aiokafka" in text]
    assert f"topic {kafka_names.topic}, group {kafka_names.group}" in result.stderr  # start-up line


def test_the_config_error_that_ended_a_pod_is_found_inside_task_group_errors() -> None:
    """``serve_with_health`` nests task groups: the ConfigError is found at any depth."""
    problem = ConfigError("topic 'x' not found")
    nested = BaseExceptionGroup("outer", [BaseExceptionGroup("inner", [problem])])
    assert setting_error(nested) is problem
    assert setting_error(BaseExceptionGroup("bug", [RuntimeError("bug")])) is None
    assert setting_error(KeyboardInterrupt()) is None
