"""``leaseworker run`` and ``leaseworker trigger``: flags, env vars, exit codes."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from leaseworker._cli import main
from leaseworker._cli._run_command import YOUNG_COLLECTION_THRESHOLD
from leaseworker_dev._services import LocalKafka

from ..kafka_util import KafkaNames, read_topic

LEASEWORKER = str(Path(sys.executable).parent / "leaseworker")
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["run", "no_such_module:Job"], "cannot import 'no_such_module'"),
        (["run", "tests.jobs"], "pkg.module:JobClass"),
        (["run", "tests.jobs:Recorder"], "not a ReportJob subclass"),
        (["run", "leaseworker:ReportJob"], "is abstract"),
        (["run", "--concurrency", "0", "tests.jobs:MarkerJob"], "must be >= 1"),
        (["run", "--process-workers", "-1", "tests.jobs:MarkerJob"], "must be >= 0"),
        (["run", "--shutdown-timeout", "soon", "tests.jobs:MarkerJob"], "not a number"),
        (["run", "--redis-url", "http://x", "tests.jobs:MarkerJob"], "redis_url"),
        (
            ["run", "--record-history", "/nonexistent/h.jsonl", "tests.jobs:MarkerJob"],
            "cannot record the history to /nonexistent/h.jsonl",
        ),
        (["trigger", "t", "--payload", "[1]"], "(not_object): payload is a JSON array"),
        (["trigger", "t", "--kafka-security-protocol", "SASL_SSL"], "SASL"),
    ],
)
def test_bad_usage_exits_2_with_a_one_line_reason(argv: list[str], reason: str) -> None:
    """Unimportable classes, bad flags and bad settings: exit 2, one line naming the problem."""
    result = subprocess.run(
        [LEASEWORKER, *argv], cwd=REPO, capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert reason in last
    assert "Traceback" not in result.stderr


def test_flags_can_come_from_leaseworker_environment_variables(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """LEASEWORKER_CONCURRENCY feeds --concurrency, and is validated like the flag."""
    monkeypatch.setenv("LEASEWORKER_CONCURRENCY", "0")
    with pytest.raises(SystemExit) as exited:
        main(["run", "tests.jobs:MarkerJob"])
    assert exited.value.code == 2
    assert "--concurrency: must be >= 1" in capsys.readouterr().err


@pytest.mark.fake  # anyio.run replaced: the pod never serves
def test_run_tunes_the_garbage_collector_before_it_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start-up objects are frozen, and young collections are rarer, once the pod serves."""
    when_serving: list[tuple[int, int]] = []
    monkeypatch.setattr(
        anyio, "run", lambda *_: when_serving.append((gc.get_freeze_count(), gc.get_threshold()[0]))
    )
    threshold = gc.get_threshold()
    gc.unfreeze()
    try:
        assert main(["run", "--store-url", "memory://", "tests.jobs:MarkerJob"]) == 0
    finally:
        gc.unfreeze()  # the test process's collector is left as it was
        gc.set_threshold(*threshold)
    [(frozen, young)] = when_serving
    assert frozen > 1000  # modules, classes, settings: thousands of objects
    assert young == YOUNG_COLLECTION_THRESHOLD > threshold[0]


@pytest.mark.parametrize("command", ["run", "trigger"])
def test_help_and_version_work_on_every_subcommand(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--help documents the env var of each flag; --version answers everywhere."""
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    assert "LEASEWORKER_BOOTSTRAP_SERVERS" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:
        main([command, "--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("leaseworker ")


def test_trigger_sends_one_record_and_prints_where_it_landed(
    kafka_server: LocalKafka, kafka_names: KafkaNames
) -> None:
    """The trigger command produces the key and JSON payload the worker will decode."""
    kafka_server.create_topics([kafka_names.topic])
    result = subprocess.run(
        [
            LEASEWORKER, "trigger", kafka_names.topic, "--key", "report:acme:2026-11",
            "--payload", '{"tenant": "acme"}',
            "--bootstrap-servers", kafka_server.bootstrap_servers,
        ],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"topic": kafka_names.topic, "partition": 0, "offset": 0}


def test_triggered_record_is_on_the_topic(
    kafka_server: LocalKafka, kafka_names: KafkaNames
) -> None:
    """What ``trigger`` wrote reads back byte for byte."""
    kafka_server.create_topics([kafka_names.topic])
    code = main(
        [
            "trigger", kafka_names.topic, "--key", "k", "--payload", '{"a": 1}',
            "--bootstrap-servers", kafka_server.bootstrap_servers,
        ]
    )  # fmt: skip
    assert code == 0
    [record] = anyio.run(read_topic, kafka_server.bootstrap_servers, kafka_names.topic, 1)
    assert (record.key, json.loads(record.value)) == (b"k", {"a": 1})


def test_trigger_speaks_kafka_sasl_when_told_and_never_prints_the_password(
    kafka_server: LocalKafka, kafka_names: KafkaNames
) -> None:
    """The trigger command passes the SASL settings to its producer (run shares them).

    The local broker speaks PLAINTEXT only, so a SASL handshake must fail: a
    clear exit 2, never a silent plaintext send, and the password never printed.
    """
    kafka_server.create_topics([kafka_names.topic])
    secret = "s3cr3t-sasl-password"
    result = subprocess.run(
        [
            LEASEWORKER, "trigger", kafka_names.topic, "--payload", '{"jobId": "j"}',
            "--bootstrap-servers", kafka_server.bootstrap_servers, "--timeout", "5",
            "--kafka-security-protocol", "SASL_PLAINTEXT", "--kafka-sasl-mechanism", "PLAIN",
            "--kafka-sasl-username", "u",
        ],
        env={**os.environ, "LEASEWORKER_KAFKA_SASL_PASSWORD": secret},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "leaseworker trigger: error:" in result.stderr
    assert secret not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("job", "reason"),
    [
        ("SyncRun", "SyncRun.run must be a coroutine function"),
        ("RaisesInInit", "RaisesInInit() raised RuntimeError: no database configured"),
        ("NeedsArguments", "NeedsArguments() must take no arguments"),
        ("TextLease", "TextLease.lease_duration must be a number of seconds, got str"),
        ("NegativeRuntime", "NegativeRuntime.max_runtime must be a finite number of seconds > 0"),
        ("ZeroLossBudget", "ZeroLossBudget.loss_budget must be >= 1, got 0"),
        ("FloatResultBound", "FloatResultBound.max_result_bytes must be an int, got float"),
        (
            "SlowRenewal",
            "SlowRenewal: renewal_interval=5.0s must be shorter than lease_duration=3.0s",
        ),
        ("BoolInterval", "BoolInterval.renewal_interval must be a number of seconds or None"),
        ("NoTopic", "NoTopic.topic must name a Kafka topic"),
    ],
)
def test_a_job_class_mistake_exits_2_naming_it_in_one_line(
    job: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked at import, before any connection: no traceback, no trigger failing later."""
    assert main(["run", f"tests.bad_jobs:{job}"]) == 2
    err = capsys.readouterr().err
    [line] = err.strip().splitlines()
    assert line.startswith("leaseworker run: error: ")
    assert reason in line
    assert "Traceback" not in err
