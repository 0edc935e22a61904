"""The worker pod against real Kafka and Redis: commits, concurrency, busy leases, dead letters."""

from __future__ import annotations

import itertools
import logging

import pytest

from leaseworker import RedisLeases
from leaseworker._kafka import DEAD_LETTER_HEADERS, DEAD_LETTER_OMITTED
from leaseworker_dev._services import LocalKafka, LocalRedis

from ..jobs import GateJob, Recorder, on_topic
from ..kafka_util import KafkaNames, committed, payload, produce, read_topic
from ..waiting import eventually
from ..worker_util import Progress, make_worker, pod_config, running


async def test_offsets_are_committed_only_for_the_contiguous_completed_prefix(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    topic: str,
) -> None:
    """With a, b, c in flight in one partition, finishing c and b commits nothing; a commits 3."""
    recorder = Recorder()
    job = on_topic(GateJob, topic)(recorder)
    config = pod_config(kafka_server, redis_server, kafka_names, namespace, concurrency=3)
    bootstrap = kafka_server.bootstrap_servers
    await produce(bootstrap, topic, [(k.encode(), payload(gate=True)) for k in "abc"])
    progress = Progress()
    async with running(make_worker(job, config, hooks=[progress])) as worker:
        await recorder.until(lambda: all(recorder.runs_of(k) for k in "abc"))
        for key in "cb":
            recorder.gate(key).set()
            await recorder.until(lambda key=key: recorder.done(key) == 1)  # type: ignore[misc]
        # The committer has looked since c and b finished: a commit past a's gap would be made.
        await progress.until(lambda: worker.stats.commit_checked >= 2, timeout=20)
        assert worker.stats.commits == 0
        assert await committed(bootstrap, kafka_names.group, topic) == {}
        recorder.gate("a").set()

        async def all_committed() -> bool:
            return await committed(bootstrap, kafka_names.group, topic) == {0: 3}

        await eventually(all_committed, within=10)
    assert worker.stats.ownership_losses == 0


async def test_concurrency_is_bounded_and_one_key_never_runs_twice_at_once(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    topic: str,
) -> None:
    """Concurrency 2: different keys run two at a time; one key's triggers run one by one."""
    recorder = Recorder()
    job = on_topic(GateJob, topic)(recorder)
    config = pod_config(kafka_server, redis_server, kafka_names, namespace, concurrency=2)
    keys = ["x", "x", "y", "z", "x", "y"]
    # Distinct inputs per trigger: identical ones would be answered `duplicate` unrun.
    records = [(k.encode(), payload(seconds=0.3, n=i)) for i, k in enumerate(keys)]
    await produce(kafka_server.bootstrap_servers, topic, records)
    async with running(make_worker(job, config)) as worker:
        await recorder.until(lambda: len([r for r in recorder.runs if r.how]) == len(keys))

        async def all_committed() -> bool:
            found = await committed(kafka_server.bootstrap_servers, kafka_names.group, topic)
            return found == {0: len(keys)}

        await eventually(all_committed, within=10)
        assert worker.stats.paused or worker.stats.pauses >= 1  # it hit its limit on the way
    assert recorder.overlaps == 0
    assert recorder.max_running == 2
    assert [r.how for r in recorder.runs] == ["completed"] * len(keys)
    for key in "xyz":
        runs = recorder.runs_of(key)
        assert all(a.stopped and a.stopped <= b.started for a, b in itertools.pairwise(runs))


async def test_a_busy_lease_is_retried_and_taken_over_after_the_holder_expires(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    topic: str,
    leases: RedisLeases,
) -> None:
    """A dead holder's lease blocks the job until it expires; the commit comes only after."""
    recorder = Recorder()
    job = on_topic(GateJob, topic)(recorder)
    config = pod_config(kafka_server, redis_server, kafka_names, namespace)
    holder = await leases.acquire("k", lease_duration=2.5)  # a pod that died holding the lease
    assert holder is not None
    bootstrap = kafka_server.bootstrap_servers
    await produce(bootstrap, topic, [(b"k", payload())])
    async with running(make_worker(job, config)):
        await recorder.until(lambda: recorder.done("k") == 1, within=15)
        run = recorder.runs_of("k")[0]

        async def committed_one() -> bool:
            return await committed(bootstrap, kafka_names.group, topic) == {0: 1}

        await eventually(committed_one, within=10)
    # The holder's lease could not expire before holder.sent_at + lease_duration (same host clock).
    assert run.started >= holder.sent_at + holder.lease_duration - 0.01
    # ...and the takeover came within one capped retry interval of the expiry.
    assert run.started <= holder.sent_at + holder.lease_duration + GateJob.busy_backoff.cap + 0.5
    assert run.fence > holder.fence


async def test_malformed_triggers_are_dead_lettered_logged_and_committed(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    topic: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Bad records are dead-lettered with their reason and committed; no payload is logged."""
    secret = "s3cr3t-payload-marker"
    recorder = Recorder()
    job = on_topic(GateJob, topic)(recorder)
    config = pod_config(
        kafka_server,
        redis_server,
        kafka_names,
        namespace,
        dead_letter_topic=kafka_names.dead_letters,
        max_payload_bytes=200,
    )
    bad = [
        (b"k1", f"not json {secret}".encode()),
        (b"k2", f'["{secret}"]'.encode()),
        (None, payload(note=secret)),  # no record key and no jobId
        (b"k3", payload(note=secret * 20)),  # over max_payload_bytes
        (b"bad{key}", payload(note=secret)),
    ]
    expected = ["not_json", "not_object", "no_job_key", "too_large", "bad_job_key"]
    bootstrap = kafka_server.bootstrap_servers
    caplog.set_level(logging.DEBUG, logger="leaseworker")
    await produce(bootstrap, topic, [*bad, (b"good", payload(note=secret))])
    async with running(make_worker(job, config)) as worker:
        await recorder.until(lambda: recorder.done("good") == 1)

        async def all_committed() -> bool:
            return await committed(bootstrap, kafka_names.group, topic) == {0: 6}

        await eventually(all_committed, within=10)
        dead = await read_topic(bootstrap, kafka_names.dead_letters, len(bad))
        assert worker.stats.dead_letters == len(bad)
    for offset, (record, (key, value), reason) in enumerate(zip(dead, bad, expected, strict=True)):
        headers = dict(record.headers)
        assert set(DEAD_LETTER_HEADERS) <= headers.keys()
        assert headers["leaseworker.error"] == reason.encode()
        assert headers["leaseworker.original.topic"] == topic.encode()
        assert headers["leaseworker.original.partition"] == b"0"
        assert headers["leaseworker.original.offset"] == str(offset).encode()
        assert (record.key, record.value) == (key, value)
    dead_lettered = [r for r in caplog.records if getattr(r, "event", "") == "dead_lettered"]
    assert len(dead_lettered) == len(bad)  # the records the next check reads are there
    for entry in caplog.records:
        assert secret not in entry.getMessage()
        assert all(secret not in str(value) for value in vars(entry).values())
    assert [r.key for r in recorder.runs] == ["good"]


async def test_a_dead_letter_too_large_for_its_topic_goes_without_its_value(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    topic: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The topic refuses the whole copy: it goes without the value, says so, and is committed.

    Before, a copy the dead-letter topic could never take was retried forever
    and the partition's commits stopped there. A header without a value (a
    null header, which Kafka allows) is copied as it is.
    """
    small = f"{kafka_names.dead_letters}-small"
    kafka_server.create_topics([small], configs={"max.message.bytes": "2048"})
    recorder = Recorder()
    job = on_topic(GateJob, topic)(recorder)
    config = pod_config(kafka_server, redis_server, kafka_names, namespace, dead_letter_topic=small)
    bootstrap = kafka_server.bootstrap_servers
    caplog.set_level(logging.WARNING, logger="leaseworker")
    await produce(bootstrap, topic, [(b"k1", b"not json " * 500)], headers=[("empty", None)])
    await produce(bootstrap, topic, [(b"good", payload())])
    async with running(make_worker(job, config)) as worker:
        await recorder.until(lambda: recorder.done("good") == 1)

        async def all_committed() -> bool:
            return await committed(bootstrap, kafka_names.group, topic) == {0: 2}

        await eventually(all_committed, within=15)
        [dead] = await read_topic(bootstrap, small, 1)
        assert worker.stats.dead_letters == 1
    assert dead.key == b"k1"
    assert dead.value is None
    assert dead.headers[0] == ("empty", None)
    headers = dict(dead.headers)
    assert headers["leaseworker.error"] == b"not_json"
    assert headers["leaseworker.original.offset"] == b"0"
    assert headers[DEAD_LETTER_OMITTED] == b"value"
    assert any(getattr(r, "event", None) == "dead_letter_trimmed" for r in caplog.records)
