"""Failed and timed-out jobs: terminal, committed, and dead-lettered (real Kafka and Redis)."""

from __future__ import annotations

import dataclasses
import datetime
import time
from typing import Any

import anyio

from leaseworker import JobContext, PodConfig, ReportJob
from leaseworker._kafka import (
    DEAD_LETTER_FAILURE_HEADERS,
    DEAD_LETTER_HEADERS,
    SourceStats,
)
from leaseworker_dev._services import LocalKafka, LocalRedis

from ..kafka_util import KafkaNames, committed, payload, produce, read_topic
from ..waiting import eventually
from ..worker_util import Progress, make_worker, pod_config, running

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
    config: PodConfig, topic: str, records: list[tuple[bytes, bytes]], *, dead: int
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
    progress = Progress()
    async with running(make_worker(_job(topic), config, hooks=[progress])) as worker:

        async def all_committed() -> bool:
            return await committed(bootstrap, kafka_names.group, topic) == {0: 2}

        await eventually(all_committed, within=20)
        await progress.until(lambda: worker.stats.job_failures == 1, timeout=20)
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
    assert headers["leaseworker.error"] == b"bad_input_version"
    assert b"surrogate" in headers["leaseworker.error.detail"]
    assert "leaseworker.error.type" not in headers  # the job never ran: nothing raised
    assert (dead.key, dead.value) == records[0]


class RefusedJob(ReportJob):
    """Outlives its lease on ``outlive``; returns a result no store keeps on the other modes."""

    lease_duration = 1.0

    async def run(self, ctx: JobContext) -> object:
        """Block the loop past the lease, or return the bad result the payload names."""
        mode = ctx.trigger.payload.get("mode")
        if mode == "outlive":
            time.sleep(1.1)  # noqa: ASYNC251 - the point: a job that outlives its lease
            await ctx.checkpoint()
        results: dict[object, object] = {
            "datetime": {"at": datetime.datetime.now(datetime.UTC)},
            "int_key": {1: "a"},
            "huge": {"rows": "x" * 2000},
        }
        return results.get(mode)


async def test_a_trigger_lost_every_time_and_bad_results_are_dead_lettered_and_committed(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    topic: str,
) -> None:
    """``lost_repeatedly`` after the loss budget, ``bad_result`` at once; the partition moves on.

    The poison trigger (it blocks the loop past its lease on every attempt)
    used to be retried forever, so no later offset of its partition was ever
    committed. Now the pod's ``loss_budget`` (2 here, overriding the class's 5)
    ends it with its last loss reason in a header; results that cannot be
    stored name their problem, and nobody says "the job raised".
    """
    records = [
        (b"report:outlive", payload(mode="outlive")),
        (b"report:datetime", payload(mode="datetime")),
        (b"report:int-key", payload(mode="int_key")),
        (b"report:huge", payload(mode="huge")),
        (b"report:ok", payload()),
    ]
    config = pod_config(
        kafka_server,
        redis_server,
        kafka_names,
        namespace,
        dead_letter_topic=kafka_names.dead_letters,
        loss_budget=2,
        max_result_bytes=1000,
    )
    job: ReportJob = type("RefusedJob", (RefusedJob,), {"topic": topic})()
    await produce(config.bootstrap_servers, topic, records)
    async with running(make_worker(job, config)) as worker:

        async def all_committed() -> bool:
            return await committed(config.bootstrap_servers, config.group, topic) == {0: 5}

        await eventually(all_committed, within=30)
        assert kafka_names.dead_letters is not None
        dead = await read_topic(config.bootstrap_servers, kafka_names.dead_letters, 4)
        assert (worker.stats.job_failures, worker.stats.dead_letters) == (4, 4)
    letters = {record.key: dict(record.headers) for record in dead}
    lost = letters[b"report:outlive"]
    assert lost["leaseworker.error"] == b"lost_repeatedly"
    assert lost["leaseworker.loss.reason"] == b"loop_blocked"
    assert lost["leaseworker.error.type"] == b"LeaseLost"
    assert b"2 executions in a row" in lost["leaseworker.error.detail"]
    for key, said in (
        (b"report:datetime", b"datetime"),
        (b"report:int-key", b"int mapping key"),
        (b"report:huge", b"limit 1000"),
    ):
        headers = letters[key]
        assert headers["leaseworker.error"] == b"bad_result"
        assert said in headers["leaseworker.error.detail"]
        assert b"raised" not in headers["leaseworker.error.detail"]
        assert "leaseworker.loss.reason" not in headers
