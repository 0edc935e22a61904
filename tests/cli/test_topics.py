"""``leaseworker topics create``: a job's topics on a real broker, refusals in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from aiokafka.admin import AIOKafkaAdminClient  # type: ignore[import-untyped]

from leaseworker_dev._services import LocalKafka, free_port

from ..kafka_util import KafkaNames


def _topics(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "leaseworker._cli", "topics", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def _partitions(kafka: LocalKafka, name: str) -> list[int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    try:
        [described] = await admin.describe_topics([name])
    finally:
        await admin.close()
    return [partition["leader"] for partition in described["partitions"]]


async def test_create_makes_led_topics_and_refuses_an_existing_one_with_one_line(
    kafka_server: LocalKafka, kafka_names: KafkaNames
) -> None:
    """Both topics exist with their partitions led on return; a second create exits 2.

    ``--if-not-exists`` makes the repeat a success, so scripts can run it on
    every start.
    """
    bootstrap = ("--bootstrap-servers", kafka_server.bootstrap_servers)
    names = (kafka_names.topic, kafka_names.dead_letters)
    created = _topics("create", *names, "--partitions", "3", *bootstrap)
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout) == {"created": list(names), "partitions": 3}
    for name in names:
        leaders = await _partitions(kafka_server, name)
        assert len(leaders) == 3
        assert all(leader >= 0 for leader in leaders)
    again = _topics("create", kafka_names.topic, *bootstrap)
    assert again.returncode == 2
    [line] = again.stderr.splitlines()
    assert line.startswith("leaseworker topics create: error: TopicAlreadyExistsError: ")
    assert line.count("TopicAlreadyExistsError") == 1  # said once, not aiokafka's twice
    assert kafka_names.topic in line
    tolerated = _topics("create", kafka_names.topic, "--if-not-exists", *bootstrap)
    assert tolerated.returncode == 0, tolerated.stderr


def test_a_refused_replication_factor_exits_2_with_the_brokers_reason(
    kafka_server: LocalKafka, kafka_names: KafkaNames
) -> None:
    """Two replicas on a one-broker cluster: the broker's refusal, in one line."""
    result = _topics(
        "create",
        kafka_names.topic,
        "--replication-factor",
        "2",
        "--bootstrap-servers",
        kafka_server.bootstrap_servers,
    )
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert "InvalidReplicationFactorError" in line


def test_an_unreachable_broker_is_one_line_without_aiokafka_noise() -> None:
    """Nothing listens: exit 2 and a single stderr line (aiokafka's own errors are muted)."""
    result = _topics(
        "create", "t", "--bootstrap-servers", f"127.0.0.1:{free_port()}", "--timeout", "5"
    )
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("leaseworker topics create: error: KafkaConnectionError")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--partitions", "0"), "must be >= 1"),
        (("--kafka-sasl-username", "u"), "SASL settings are given"),
    ],
)
def test_bad_flags_exit_2_before_any_connection(args: tuple[str, ...], expected: str) -> None:
    """Flag errors (argparse's and the Kafka security checks) are one line and exit 2."""
    result = _topics("create", "t", "--bootstrap-servers", "127.0.0.1:1", *args)
    assert result.returncode == 2
    assert expected in result.stderr.splitlines()[-1]
