"""``leaseworker trigger``: payloads from a file or stdin, the worker's checks, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import anyio
import pytest

from leaseworker_dev._services import LocalKafka, free_port

from ..kafka_util import KafkaNames, read_topic
from ..pods import LEASEWORKER, REPO


def _trigger(*argv: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [LEASEWORKER, "trigger", *argv],
        cwd=REPO,
        input=stdin,
        capture_output=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONWARNINGS": "default"},  # an unclosed client would say so
    )


def _one_line_exit_2(result: subprocess.CompletedProcess[bytes]) -> str:
    """Check the command exited 2 with exactly one line on stderr; return it."""
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("leaseworker trigger: error: ")
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["--payload", '{"a": NaN}'], "(not_json): NaN is not valid JSON"),
        (["--payload", "{bad}"], "(not_json): Expecting property name"),
        (["--payload", '{"a": 1}', "--key", "{bad}"], "(bad_job_key)"),
        (["--payload", '{"jobId": "a\\u0000b"}'], "(bad_job_key)"),
        (["--payload", '{"a": 1}', "--key", ""], "(no_job_key)"),
        (["--payload", '{"a": "xxxx"}', "--max-payload-bytes", "8"], "(too_large)"),
        (["--payload-file", "/nonexistent/payload.json"], "cannot read /nonexistent/payload.json"),
    ],
)
def test_a_trigger_the_worker_would_refuse_is_not_sent(argv: list[str], reason: str) -> None:
    """Checked before any connection (the broker address is closed): exit 2, one line."""
    bootstrap = f"127.0.0.1:{free_port()}"
    line = _one_line_exit_2(_trigger("t", "--bootstrap-servers", bootstrap, *argv))
    assert reason in line
    assert "would refuse" in line or "cannot read" in line


def test_payloads_come_from_a_file_or_from_stdin(
    kafka_server: LocalKafka, kafka_names: KafkaNames, tmp_path: Path
) -> None:
    """``--payload-file`` and ``--payload -`` send what they read, beyond argv's size limit."""
    kafka_server.create_topics([kafka_names.topic])
    big = {"rows": ["x" * 100] * 3000}  # about 300 kB: more than one argv string may hold
    path = tmp_path / "payload.json"
    path.write_text(json.dumps(big))
    bootstrap = ["--bootstrap-servers", kafka_server.bootstrap_servers]
    from_file = _trigger(kafka_names.topic, "--key", "f", "--payload-file", str(path), *bootstrap)
    from_stdin = _trigger(
        kafka_names.topic, "--key", "s", "--payload", "-", *bootstrap, stdin=b'{"a": 1}'
    )
    for result in (from_file, from_stdin):
        assert result.returncode == 0, result.stderr
    records = anyio.run(read_topic, kafka_server.bootstrap_servers, kafka_names.topic, 2)
    assert [(r.key, json.loads(r.value)) for r in records] == [(b"f", big), (b"s", {"a": 1})]


def test_a_missing_topic_is_one_line_and_exit_2(
    kafka_server: LocalKafka, kafka_names: KafkaNames
) -> None:
    """Before: 49 aiokafka errors, then ``error: TimeoutError: `` with an empty message."""
    result = _trigger(
        kafka_names.topic, "--payload", "{}", "--bootstrap-servers", kafka_server.bootstrap_servers
    )
    line = _one_line_exit_2(result)
    assert f"topic '{kafka_names.topic}' not found on Kafka" in line


def test_an_unreachable_broker_is_one_line_and_exit_2_with_no_unclosed_producer() -> None:
    """Before: aiokafka's errors, ``Unclosed AIOKafkaProducer`` and exit 1."""
    bootstrap = f"127.0.0.1:{free_port()}"
    result = _trigger("t", "--bootstrap-servers", bootstrap, "--timeout", "2")
    line = _one_line_exit_2(result)
    assert f"Kafka at {bootstrap} did not take the trigger within 2s" in line
    assert b"Unclosed" not in result.stderr
