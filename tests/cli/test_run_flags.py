"""``leaseworker run`` flags: each one reaches PodConfig from its flag and its env var."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from typing import Any

import pytest

from leaseworker import PodConfig
from leaseworker._cli import main
from leaseworker._cli._common import env_name
from leaseworker._cli._main import build_parser
from leaseworker._cli._run_command import RUN_SETTINGS, build_config

from ..pods import LEASEWORKER, REPO

JOB = "tests.jobs:MarkerJob"

# flag, text given, PodConfig field, value expected there
FLAGS: list[tuple[str, str, str, Any]] = [
    ("--bootstrap-servers", "k1:9092,k2:9092", "bootstrap_servers", "k1:9092,k2:9092"),
    ("--redis-url", "redis://redis:6380/2", "redis_url", "redis://redis:6380/2"),
    ("--group", "reports", "group", "reports"),
    ("--pod", "pod-7", "pod", "pod-7"),
    ("--namespace", "acme", "namespace", "acme"),
    ("--concurrency", "9", "concurrency", 9),
    ("--shutdown-timeout", "45", "shutdown_timeout", 45.0),
    ("--dead-letter-topic", "reports.dead", "dead_letter_topic", "reports.dead"),
    ("--session-timeout", "12", "session_timeout", 12.0),
    ("--heartbeat-interval", "1.5", "heartbeat_interval", 1.5),
    ("--max-poll-interval", "90", "max_poll_interval", 90.0),
    ("--revoke-timeout", "7", "revoke_timeout", 7.0),
    ("--commit-timeout", "4", "commit_timeout", 4.0),
    ("--kafka-timeout", "40", "kafka_timeout", 40.0),
    ("--redis-timeout", "0.25", "redis_timeout", 0.25),
    ("--max-payload-bytes", "4096", "max_payload_bytes", 4096),
    ("--loss-budget", "3", "loss_budget", 3),
    ("--max-result-bytes", "2048", "max_result_bytes", 2048),
    ("--process-workers", "0", "process_workers", 0),
    ("--auto-offset-reset", "latest", "auto_offset_reset", "latest"),
    ("--outbox-retention", "3600", "outbox_retention", 3600.0),
    ("--outbox-claim-timeout", "45", "outbox_claim_timeout", 45.0),
    ("--outbox-relay-connections", "5", "outbox_relay_connections", 5),
]  # fmt: skip


def _config(argv: list[str]) -> Any:
    args = build_parser().parse_args(["run", *argv, JOB])
    return build_config(args)


@pytest.mark.parametrize(("flag", "text", "field", "expected"), FLAGS)
def test_every_run_flag_reaches_the_config_from_its_flag_and_its_env_var(
    flag: str, text: str, field: str, expected: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LEASEWORKER_<FLAG> sets the field; the flag sets it too and wins over the env var."""
    default = getattr(_config([]), field)
    assert default != expected  # otherwise the test could not fail
    monkeypatch.setenv(env_name(flag), text)
    assert getattr(_config([]), field) == expected
    monkeypatch.delenv(env_name(flag))
    assert getattr(_config([flag, text]), field) == expected
    monkeypatch.setenv(env_name(flag), "not-used")
    assert getattr(_config([flag, text]), field) == expected


# switch, PodConfig field, the field's value without the switch
SWITCHES: list[tuple[str, str, bool]] = [
    ("--log-job-errors", "log_job_errors", False),
    ("--no-lease-pipelining", "lease_pipelining", True),
]


@pytest.mark.parametrize(("flag", "field", "default"), SWITCHES)
def test_a_switch_flips_its_field_from_the_flag_or_its_env_var(
    flag: str, field: str, default: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A switch takes no value; LEASEWORKER_<SWITCH>=1/0 (yes/no, on/off) sets its default."""
    monkeypatch.delenv(env_name(flag), raising=False)
    assert getattr(_config([]), field) is default
    assert getattr(_config([flag]), field) is not default
    for text, switched in (("1", True), ("yes", True), ("on", True), ("0", False), ("off", False)):
        monkeypatch.setenv(env_name(flag), text)
        assert getattr(_config([]), field) is (default is not switched)
    assert getattr(_config([flag]), field) is not default  # the flag wins over "off"


# PodConfig fields without a flag of their own, and why
NOT_FLAGS = {
    "kafka_security": "built from the --kafka-* flags",
    "redis_url_file": "--redis-url-file, the file form of the secret --redis-url",
    "store_url_file": "--store-url-file, the file form of the secret --store-url",
    "poll_timeout": "an internal cadence, not an operator's setting",
    "startup_retry_cap": "an internal cadence, not an operator's setting",
}


def test_every_worker_config_field_has_a_run_flag_or_a_stated_reason() -> None:
    """A field added to PodConfig without a row in RUN_SETTINGS (or a reason) fails here."""
    flagged = [row.field for row in RUN_SETTINGS if row.field is not None]
    assert len(flagged) == len(set(flagged))
    fields = {f.name for f in dataclasses.fields(PodConfig)}
    assert set(flagged) | set(NOT_FLAGS) == fields
    assert not set(flagged) & set(NOT_FLAGS)


def test_run_without_flags_or_env_vars_builds_worker_configs_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The defaults ``run --help`` shows are PodConfig's own: none is repeated by hand."""
    for name in [n for n in os.environ if n.startswith("LEASEWORKER_")]:
        monkeypatch.delenv(name)
    assert _config([]) == PodConfig()


def test_run_help_lists_every_flag_with_its_env_var(capsys: pytest.CaptureFixture[str]) -> None:
    """``run --help`` names each flag of the table and the variable that backs it."""
    with pytest.raises(SystemExit) as exited:
        main(["run", "--help"])
    assert exited.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for flag in [flag for flag, *_ in FLAGS] + [flag for flag, *_ in SWITCHES]:
        assert flag in shown
        assert env_name(flag) in shown


@pytest.mark.parametrize(
    ("argv", "env", "reason"),
    [
        (["--heartbeat-interval", "0"], {}, "must be a finite number of seconds > 0"),
        (["--kafka-timeout", "inf"], {}, "must be a finite number of seconds > 0"),
        (["--redis-url", "redis://:pw@h:notaport/0"], {}, "not a valid Redis URL"),
        ([], {"LEASEWORKER_LOG_LEVEL": "verbose"}, "LEASEWORKER_LOG_LEVEL: must be one of"),
        (["--max-poll-interval", "never"], {}, "not a number of seconds"),
        ([], {"LEASEWORKER_MAX_PAYLOAD_BYTES": "0"}, "must be >= 1"),
        (["--heartbeat-interval", "12"], {}, "shorter than session_timeout"),
        (["--revoke-timeout", "60"], {}, "must exceed the rebalance timeout"),
        ([], {"LEASEWORKER_LOG_JOB_ERRORS": "maybe"}, "must be 1 or 0"),
        (["--outbox-retention", "-5"], {}, "must be a finite number of seconds > 0"),
        ([], {"LEASEWORKER_OUTBOX_CLAIM_TIMEOUT": "soon"}, "not a number of seconds"),
        (["--outbox-claim-timeout", "12"], {}, "must exceed the relay's send bound (25.0s"),
        (["--store-timeout", "10"], {}, "outbox_claim_timeout=30.0s must exceed"),
    ],
)
def test_bad_tuning_values_exit_2_with_one_line(
    argv: list[str], env: dict[str, str], reason: str
) -> None:
    """Unparsable or unsafe tuning values: exit 2 and a one-line reason, no traceback."""
    result = subprocess.run(
        [LEASEWORKER, "run", *argv, JOB],
        cwd=REPO,
        env={**_clean_env(), **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert reason in result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("LEASEWORKER_")}
