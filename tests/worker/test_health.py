"""``leaseworker run --health-port`` against real Kafka and Redis: readiness and stalls.

The pods are real processes; the test reaches Kafka and Redis through
:class:`ChaosProxy` so it decides when the pod can join its group, instead of
racing the join. The loop-blocking job waits for a file the test writes, so
the stall lasts exactly as long as the test needs it to.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path

from leaseworker import JobContext, ReportJob
from leaseworker.testing import ChaosProxy
from leaseworker_dev._services import LocalKafka, LocalRedis, PodProcess, free_port

from ..health_util import probe
from ..kafka_util import KafkaNames, payload, produce
from ..waiting import eventually

STALL_THRESHOLD = 0.5


class LoopBlockingJob(ReportJob):
    """Blocks the event loop (``time.sleep``, no await) until ``$LW_TEST_RELEASE`` exists.

    Writes ``$LW_TEST_BLOCKING`` first, so the test knows the stall has begun.
    """

    topic = os.environ.get("LW_TEST_TOPIC", "unset")
    lease_duration = 30.0

    async def run(self, ctx: JobContext) -> object:
        """Block the loop on purpose (a synchronous call, no await); return once released."""
        _block_until_released(ctx.job_key)
        return None


def _block_until_released(job_key: str) -> None:
    Path(os.environ["LW_TEST_BLOCKING"]).write_text(job_key)
    release = Path(os.environ["LW_TEST_RELEASE"])
    deadline = time.monotonic() + 60  # never block forever, even if the test dies
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


async def test_pod_is_ready_only_after_joining_its_group_and_reaching_redis(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    health_pods: Callable[..., PodProcess],
) -> None:
    """/readyz is 503 while Redis or Kafka is unreachable (saying which), 200 once joined.

    /healthz stays 200 throughout: an unreachable dependency is not a reason
    to restart the pod.
    """
    kafka_server.create_topics([kafka_names.topic], partitions=2)
    port = free_port()
    async with ChaosProxy(redis_server.port) as redis, ChaosProxy(kafka_server.port) as kafka:
        redis.refuse = kafka.refuse = True
        env = {
            "LEASEWORKER_BOOTSTRAP_SERVERS": f"127.0.0.1:{kafka.port}",
            "LEASEWORKER_REDIS_URL": f"redis://127.0.0.1:{redis.port}/0",
            "LEASEWORKER_GROUP": kafka_names.group,
            "LEASEWORKER_NAMESPACE": namespace,
            "LEASEWORKER_HEALTH_PORT": str(port),
            "LEASEWORKER_HEALTH_HOST": "127.0.0.1",
            "LW_TEST_TOPIC": kafka_names.topic,
        }
        health_pods("pod-a", "tests.jobs:MarkerJob", env)

        async def answers() -> bool:
            try:
                await probe(port, "/healthz")
            except OSError:
                return False
            return True

        await eventually(answers, within=30)

        async def says(text: str) -> bool:
            return any(text in reason for reason in (await probe(port, "/readyz"))[1]["reasons"])

        # What start-up waits for, and the wait, as the pod's own log line says it.
        await eventually(functools.partial(says, f"Redis at 127.0.0.1:{redis.port} unavailable"))
        status, body = await probe(port, "/readyz")
        assert status == 503
        assert body["status"] == "not_ready"
        assert body["kafka"]["membership"] in ("starting", "joining")
        assert body["redis"]["answered"] is False
        assert "; retrying in " in body["waiting_for"]
        assert (await probe(port, "/healthz"))[0] == 200

        redis.refuse = False

        async def redis_answers() -> bool:
            return bool((await probe(port, "/readyz"))[1]["redis"]["answered"])

        await eventually(redis_answers, within=30)
        kafka_away = f"Kafka at 127.0.0.1:{kafka.port} unavailable for the consumer"
        await eventually(functools.partial(says, kafka_away), within=30)
        status, body = await probe(port, "/readyz")
        assert status == 503
        membership = body["kafka"]["membership"]
        assert body["reasons"] == [body["waiting_for"], f"kafka consumer is {membership}"]

        kafka.refuse = False

        async def ready() -> bool:
            return (await probe(port, "/readyz"))[0] == 200

        await eventually(ready, within=60)
        status, body = await probe(port, "/readyz")
        assert body["status"] == "ready"
        assert body["reasons"] == []
        assert body["waiting_for"] is None
        assert body["kafka"]["membership"] == "assigned"
        assert body["kafka"]["assigned_partitions"] == 2
        assert (await probe(port, "/healthz"))[0] == 200


async def test_healthz_reports_a_stall_while_a_job_blocks_the_loop_and_recovers(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    health_pods: Callable[..., PodProcess],
    tmp_path: Path,
) -> None:
    """While a job blocks the event loop, /healthz answers 503 with the growing loop lag.

    The answer comes from the health thread during the stall (a probe served
    by the loop could not answer at all); after the job stops blocking,
    /healthz is 200 again and counts the stall.
    """
    kafka_server.create_topics([kafka_names.topic], partitions=1)
    port = free_port()
    blocking, release = tmp_path / "blocking", tmp_path / "release"
    env = {
        "LEASEWORKER_BOOTSTRAP_SERVERS": kafka_server.bootstrap_servers,
        "LEASEWORKER_REDIS_URL": redis_server.url,
        "LEASEWORKER_GROUP": kafka_names.group,
        "LEASEWORKER_NAMESPACE": namespace,
        "LW_TEST_TOPIC": kafka_names.topic,
        "LW_TEST_BLOCKING": str(blocking),
        "LW_TEST_RELEASE": str(release),
    }
    health_pods(
        "pod-a",
        "tests.worker.test_health:LoopBlockingJob",
        env,
        "--health-port",
        str(port),
        "--health-host",
        "127.0.0.1",
        "--stall-threshold",
        str(STALL_THRESHOLD),
    )

    async def ready() -> bool:
        try:
            return (await probe(port, "/readyz"))[0] == 200
        except OSError:
            return False

    await eventually(ready, within=60)
    status, body = await probe(port, "/healthz")
    assert (status, body["status"], body["stalls"]) == (200, "ok", 0)

    await produce(kafka_server.bootstrap_servers, kafka_names.topic, [(b"k1", payload())])

    async def stalled() -> bool:
        return blocking.exists() and (await probe(port, "/healthz"))[0] == 503

    await eventually(stalled, within=30)
    status, body = await probe(port, "/healthz")
    assert status == 503
    assert body["status"] == "stalled"
    assert body["loop_lag_seconds"] > STALL_THRESHOLD
    assert body["stall_threshold_seconds"] == STALL_THRESHOLD

    release.write_text("go")

    async def recovered() -> bool:
        return (await probe(port, "/healthz"))[0] == 200

    await eventually(recovered, within=30)
    status, body = await probe(port, "/healthz")
    assert body["status"] == "ok"
    assert body["stalls"] >= 1
    assert body["max_loop_lag_seconds"] > STALL_THRESHOLD
