"""LocalKafka: a real KRaft broker that serves aiokafka clients and stops by PID."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import socket
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # type: ignore[import-untyped]
from aiokafka.errors import TopicAlreadyExistsError  # type: ignore[import-untyped]
from aiokafka.structs import TopicPartition  # type: ignore[import-untyped]

from leaseworker_dev._services import LocalKafka, _kafka, _kafka_install, _proc, free_port
from leaseworker_dev._services._kafka import ensure_installed, random_cluster_id


async def _consume_one(kafka: LocalKafka, topic: str, group: str) -> tuple[bytes, int, int]:
    """Join ``group``, read one record, commit it by hand; return value, partition, offset."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka.bootstrap_servers,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        async with asyncio.timeout(30):
            record = await consumer.getone()
        await consumer.commit()
        partition = TopicPartition(topic, record.partition)
        assert await consumer.committed(partition) == record.offset + 1
        return record.value, record.partition, record.offset
    finally:
        await consumer.stop()


async def test_produce_consume_commit_then_stop() -> None:
    """A fresh broker creates topics, keeps a group's manual commit, and exits on stop()."""
    kafka = LocalKafka.start()
    try:
        assert re.fullmatch(r"127\.0\.0\.1:\d+", kafka.bootstrap_servers)
        topic = f"jobs-{uuid.uuid4().hex[:8]}"
        kafka.create_topics([topic], partitions=2)
        kafka.create_topics([topic], partitions=2, exist_ok=True)
        with pytest.raises(TopicAlreadyExistsError):
            kafka.create_topics([topic], partitions=2)

        producer = AIOKafkaProducer(
            bootstrap_servers=kafka.bootstrap_servers, acks="all", enable_idempotence=True
        )
        await producer.start()
        try:
            first = await producer.send_and_wait(topic, b"first", key=b"job-1")
            assert await _consume_one(kafka, topic, "workers") == (
                b"first",
                first.partition,
                first.offset,
            )
            # Same key, same partition: a new member of the group starts after the
            # committed offset, so it sees only the second record.
            second = await producer.send_and_wait(topic, b"second", key=b"job-1")
            assert second.partition == first.partition
            assert await _consume_one(kafka, topic, "workers") == (
                b"second",
                second.partition,
                second.offset,
            )
        finally:
            await producer.stop()
    finally:
        kafka.stop()
    assert kafka.process.popen.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.kill(kafka.process.pid, 0)
    assert not kafka.workdir.exists()


def test_broker_that_dies_is_reported_with_its_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker that cannot bind its port fails start() with the cause from its log."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        ports = itertools.chain([held.getsockname()[1]], iter(free_port, None))
        # The broker's ports come from _proc.distinct_free_ports, which asks _proc.free_port.
        monkeypatch.setattr(_proc, "free_port", lambda: next(ports))
        with pytest.raises(RuntimeError, match="did not become ready") as caught:
            LocalKafka.start(timeout=60)
    assert "Address already in use" in str(caught.value)


def test_missing_java_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without java on PATH or in JAVA_HOME, start() says what to install."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(RuntimeError, match=r"java not found.*Java 17"):
        LocalKafka.start()


def test_missing_maven_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With an empty cache and no mvn, ensure_installed() says Maven is needed."""
    monkeypatch.setenv("LEASEWORKER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"Maven \(mvn\) is not installed"):
        ensure_installed()


def test_cached_jars_need_no_maven(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once fetched, the jars are found again without running (or having) Maven."""
    libs = LocalKafka.ensure_installed()
    monkeypatch.setenv("PATH", str(tmp_path))
    assert ensure_installed() == libs
    assert (libs / f"kafka_2.13-{_kafka.kafka_version()}.jar").is_file()
    assert not libs.is_relative_to(Path(__file__).resolve().parents[2])


def test_random_cluster_id_is_kafka_shaped() -> None:
    """Cluster ids are 22 URL-safe base64 characters that never start with '-'."""
    ids = {random_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    for cluster_id in ids:
        assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{21}", cluster_id)


def test_the_first_formats_checkpoint_is_kept_and_the_next_broker_copies_it(tmp_path: Path) -> None:
    """Without SCRAM users, one format runs the tool; the next copies its checkpoint.

    The jars are linked into a directory of the test's, so the kept checkpoint is
    its own. The copy is byte for byte the first (the tool would write other
    timestamps), and ``meta.properties`` names the second broker's own cluster.
    """
    libs = tmp_path / "kafka" / "libs"
    libs.parent.mkdir()
    libs.symlink_to(ensure_installed())
    checkpoint = Path("data", "__cluster_metadata-0", "00000000000000000000-0000000000.checkpoint")
    formatted = []
    for n in range(2):
        workdir = tmp_path / f"broker-{n}"
        workdir.mkdir()
        port, controller = _proc.distinct_free_ports(2)
        voters = {7: ("127.0.0.1", controller)}
        listen = ("127.0.0.1", port, controller)
        properties = _kafka._write_config(workdir, listen, {}, node_id=7, voters=voters)
        cluster_id = random_cluster_id()
        java = _kafka_install.find_java()
        _kafka_install._format(
            java, libs, workdir, properties, cluster_id, None, node_id=7, timeout=60
        )
        meta = (workdir / "data" / "meta.properties").read_text()
        assert f"cluster.id={cluster_id}\n" in meta
        assert "node.id=7\n" in meta
        formatted.append((workdir / checkpoint).read_bytes())
    kept = libs.parent / "storage-template" / checkpoint.name
    assert formatted[1] == formatted[0] == kept.read_bytes()
