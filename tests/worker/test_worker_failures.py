"""Failed and timed-out jobs: terminal, committed, and dead-lettered (real Kafka and Redis)."""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio

from leaseworker import JobContext, ReportJob, WorkerConfig
from leaseworker._dev._services import LocalRedis
from leaseworker._dev._services._kafka import LocalKafka
from leaseworker._kafka import (
    DEAD_LETTER_FAILURE_HEADERS,
    DEAD_LETTER_HEADERS,
    SourceStats,
)

from ..kafka_util import KafkaNames, committed, payload, produce, read_topic
from ..waiting import eventually
from ..worker_util import make_worker, pod_config, running

SECRET = "s3cr3t-payload-marker"


class FailingJob(ReportJob):
    """Raises (message quoting the payload) on ``fail``, hangs past max_runtime on ``hang``."""

    lease_duration = 3.0
    max_runtime = 0.5

    async def run(self, ctx: JobContext) -> object:
        """Fail, hang until max_runtime cancels it, or complete, as the payload says."""
        mode = ctx.trigger.payload.get("mode")
        if mode == "fail":
            raise ValueError(f"cannot total {ctx.trigger.payload.get('note')}")
        if mode == "hang":
            await anyio.sleep_forever()
        return None


def _job(topic: str) -> ReportJob:
    job_class: type[FailingJob] = type("FailingJob", (FailingJob,), {"topic": topic})
    return job_class()


async def _dead_letters_of(
    config: WorkerConfig, topic: str, records: list[tuple[bytes, bytes]], *, dead: int
) -> tuple[list[Any], SourceStats]:
    """Run a pod over ``records`` until all are committed; return ``dead`` dead letters.

    Also returns the pod's source counters as they were then.
    """
    bootstrap = config.bootstrap_servers
    await produce(bootstrap, topic, records)
    async with running(make_worker(_job(topic), config)) as worker:

        async def all_committed() -> bool:
            return await committed(bootstrap, config.group, topic) == {0: len(records)}

        await eventually(all_committed, within=20)
        assert config.dead_letter_topic is not None
        letters = await read_topic(bootstrap, config.dead_letter_topic, dead)
        return letters, dataclasses.replace(worker.stats)


async def test_failed_and_timed_out_triggers_are_dead_lettered_then_committed(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    topic: str,
) -> None:
    """job_failed / job_timed_out records carry the exception type, never its message.

    Both outcomes are terminal: all three offsets are committed, and the two
    that did not complete are on the dead-letter topic with their original
    key, value and position.
    """
    records = [
        (b"report:f", payload(mode="fail", note=SECRET)),
        (b"report:h", payload(mode="hang")),
        (b"report:ok", payload()),
    ]
    config = pod_config(
        kafka_server,
        redis_server,
        kafka_names,
        namespace,
        dead_letter_topic=kafka_names.dead_letters,
    )
    dead, stats = await _dead_letters_of(config, topic, records, dead=2)
    assert (stats.job_failures, stats.dead_letters) == (2, 2)
    expected = [("job_failed", "ValueError"), ("job_timed_out", "LeaseTimeout")]
    for offset, (record, (key, value), (reason, error_type)) in enumerate(
        zip(dead, records, expected, strict=False)
    ):
        headers = dict(record.headers)
        assert {*DEAD_LETTER_HEADERS, *DEAD_LETTER_FAILURE_HEADERS} <= headers.keys()
        assert headers["leaseworker.error"] == reason.encode()
        assert headers["leaseworker.error.type"] == error_type.encode()
        assert headers["leaseworker.job.key"] == key
        assert headers["leaseworker.original.offset"] == str(offset).encode()
        assert (record.key, record.value) == (key, value)
        assert all(SECRET.encode() not in header for header in headers.values())


async def test_without_a_dead_letter_topic_a_failed_trigger_is_still_committed(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    topic: str,
) -> None:
    """No dead-letter topic: the failure is counted and committed, the partition moves on."""
    bootstrap = kafka_server.bootstrap_servers
    config = pod_config(kafka_server, redis_server, kafka_names, namespace)
    await produce(bootstrap, topic, [(b"report:f", payload(mode="fail")), (b"report:ok", b"{}")])
    async with running(make_worker(_job(topic), config)) as worker:

        async def all_committed() -> bool:
            return await committed(bootstrap, kafka_names.group, topic) == {0: 2}

        await eventually(all_committed, within=20)
        await worker.wait_until(lambda: worker.stats.job_failures == 1, timeout=20)
        assert worker.stats.dead_letters == 0


async def test_an_input_version_no_store_could_keep_fails_the_trigger_alone(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    topic: str,
) -> None:
    """An inputVersion with a lone surrogate (valid JSON) is dead-lettered as a failure.

    It used to reach the SQLite store, whose encoding error escaped the
    executor and tore down the pod's source; the record was then redelivered
    to crash the next pod too.
    """
    records = [(b"report:v", b'{"inputVersion": "v\\ud800"}'), (b"report:ok", payload())]
    config = pod_config(
        kafka_server,
        redis_server,
        kafka_names,
        namespace,
        dead_letter_topic=kafka_names.dead_letters,
    )
    [dead], stats = await _dead_letters_of(config, topic, records, dead=1)
    assert (stats.job_failures, stats.dead_letters) == (1, 1)
    headers = dict(dead.headers)
    assert headers["leaseworker.error"] == b"job_failed"
    assert headers["leaseworker.error.type"] == b"ValueError"
    assert (dead.key, dead.value) == records[0]
