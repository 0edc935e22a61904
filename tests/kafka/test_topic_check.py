"""The start-up topic check: a missing job or dead-letter topic is a setting, unless auto-made."""

from __future__ import annotations

import logging

import anyio
import pytest

from leaseworker import ConfigError
from leaseworker_dev._services import LocalKafka, LocalRedis

from ..jobs import GateJob, Recorder, on_topic
from ..kafka_util import KafkaNames
from ..worker_util import make_worker, pod_config, running


@pytest.mark.parametrize("missing", ["job topic", "dead-letter topic"])
async def test_a_missing_topic_ends_start_up_with_a_config_error_naming_it(
    missing: str,
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The broker does not create topics: ``run()`` raises at once, in a handful of log lines.

    Before the check the pod stayed "joining" (a missing job topic) or stalled
    its partition at the first dead letter, while aiokafka logged an error
    several times a second.
    """
    caplog.set_level(logging.INFO)
    kafka_server.create_topics(
        [kafka_names.dead_letters if missing == "job topic" else kafka_names.topic]
    )
    absent = kafka_names.topic if missing == "job topic" else kafka_names.dead_letters
    job = on_topic(GateJob, kafka_names.topic)(Recorder())
    config = pod_config(
        kafka_server,
        redis_server,
        kafka_names,
        namespace,
        dead_letter_topic=kafka_names.dead_letters,
    )
    with pytest.raises(ConfigError) as raised, anyio.fail_after(60):
        await make_worker(job, config).run()
    assert f"topic '{absent}' not found" in str(raised.value)
    assert "auto.create.topics.enable=false" in str(raised.value)
    assert len([r for r in caplog.records if r.name.startswith("aiokafka")]) <= 5


async def test_a_broker_that_creates_topics_on_use_lets_the_pod_start_without_them(
    own_kafka: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``auto.create.topics.enable=true`` is read from the broker; the pod starts and says so."""
    caplog.set_level(logging.INFO)
    job = on_topic(GateJob, kafka_names.topic)(Recorder())
    config = pod_config(
        own_kafka, redis_server, kafka_names, namespace, dead_letter_topic=kafka_names.dead_letters
    )
    async with running(make_worker(job, config)):
        pass
    assert [r for r in caplog.records if getattr(r, "event", "") == "topics_auto_created"]
