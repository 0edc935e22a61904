"""The worker image as a container: triggers, probes, SIGTERM drain and a SIGKILL takeover.

Each container runs ``leaseworker run`` from the image (read-only root, uid
10001, host network) against the suite's own Kafka, Redis and PostgreSQL.
Each container records its history (``--record-history``) on ``time.monotonic()``, which the host
and the containers share (one kernel), so times compare across them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from redis.asyncio import Redis

from leaseworker import RedisLeases
from leaseworker_dev._services import LocalKafka

from ..health_util import probe
from ..kafka_util import KafkaNames, committed, payload, produce
from ..pods import overlapping
from ..waiting import eventually
from .podman import Container, Podman, recorded

SESSION_TIMEOUT = 6.0
BUSY_RETRY_CAP = 5.0  # ReportJob.busy_backoff default cap
REBALANCE_ALLOWANCE = 3.0  # heartbeat + JoinGroup/SyncGroup + offset fetch + first poll
READY_WITHIN = 60.0


async def _ready(container: Container) -> float:
    """Wait until /readyz answers 200 (probed from the host); return the seconds it took."""
    started = time.monotonic()

    async def ready() -> bool:
        try:
            status, _ = await probe(container.health_port, "/readyz")
        except OSError:
            return False
        return status == 200

    await eventually(ready, within=READY_WITHIN)
    return time.monotonic() - started


async def _all_committed(kafka: LocalKafka, names: KafkaNames, expected: dict[int, int]) -> None:
    async def done() -> bool:
        found = await committed(kafka.bootstrap_servers, names.group, names.topic)
        return found == expected

    await eventually(done, within=60)


async def test_a_container_runs_triggers_commits_them_and_answers_its_probes(
    kafka_server: LocalKafka,
    kafka_names: KafkaNames,
    containers: Callable[..., Container],
    engine: Podman,
) -> None:
    """Triggers sent from the host complete and are committed; probes answer inside and out.

    /healthz and /readyz answer 200 from inside the container on the port the
    manifests probe, and the image's HEALTHCHECK passes (``podman healthcheck run``).
    """
    kafka_server.create_topics([kafka_names.topic, kafka_names.dead_letters], partitions=2)
    worker = containers("a", "--concurrency", "4")
    print(f"container start to ready: {await _ready(worker):.2f}s")
    keys = [f"report:{i}" for i in range(8)]
    await produce(
        kafka_server.bootstrap_servers,
        kafka_names.topic,
        [(key.encode(), payload(seconds=0.05)) for key in keys],
    )
    found = await _committed_total(kafka_server, kafka_names, len(keys))
    assert sum(found.values()) == len(keys)
    completed = {e.job_key for e in recorded([worker]) if e.outcome == "completed"}
    assert completed == set(keys)
    assert worker.inside("/healthz") == 200
    assert worker.inside("/readyz") == 200
    assert engine("healthcheck", "run", worker.name, check=False).returncode == 0
    assert "Traceback" not in worker.logs()


async def _committed_total(kafka: LocalKafka, names: KafkaNames, total: int) -> dict[int, int]:
    found: dict[int, int] = {}

    async def done() -> bool:
        found.update(await committed(kafka.bootstrap_servers, names.group, names.topic))
        return sum(found.values()) == total

    await eventually(done, within=60)
    return found


async def test_podman_stop_drains_and_the_container_exits_zero_within_the_drain(
    kafka_server: LocalKafka,
    kafka_names: KafkaNames,
    containers: Callable[..., Container],
    engine: Podman,
) -> None:
    """SIGTERM (``podman stop``): drained, released, committed, exit 0, long before SIGKILL.

    The short job completes and is committed; the long one is cancelled at the
    shutdown timeout and its trigger left for the next owner.
    """
    shutdown = 2.0
    kafka_server.create_topics([kafka_names.topic, kafka_names.dead_letters], partitions=1)
    worker = containers("t", "--shutdown-timeout", str(shutdown), "--concurrency", "2",
                        LW_TEST_LEASE="10")  # fmt: skip
    await _ready(worker)
    await produce(
        kafka_server.bootstrap_servers,
        kafka_names.topic,
        [(b"short", payload(seconds=1.5)), (b"long", payload(seconds=60))],
    )

    async def both_started() -> bool:
        return {e.job_key for e in recorded([worker])} == {"short", "long"}

    await eventually(both_started, within=30)
    grace = 30
    started = time.monotonic()
    engine("stop", "--time", str(grace), worker.name, timeout=grace + 30)
    drained = time.monotonic() - started
    print(f"SIGTERM to exit (shutdown timeout {shutdown}s): {drained:.2f}s")
    assert worker.exit_code() == 0, worker.logs()[-3000:]
    bound = shutdown + 2 * 0.5 + 0.5 + 5.0 + 3.0  # drain + release + commit + stop overhead
    assert drained < bound
    stops = {e.job_key: e.outcome for e in recorded([worker])}
    assert stops == {"short": "completed", "long": "cancelled"}
    found = await committed(kafka_server.bootstrap_servers, kafka_names.group, kafka_names.topic)
    assert found.get(0, 0) <= 1  # the long one's trigger stays uncommitted for the next owner


async def test_a_sigkilled_containers_keys_are_taken_over_by_another_within_the_bound(
    kafka_server: LocalKafka,
    kafka_names: KafkaNames,
    containers: Callable[..., Container],
    engine: Podman,
    redis: Redis,
    namespace: str,
) -> None:
    """``podman kill -s KILL`` mid-job: a second container completes every trigger.

    Bound: max(lease, session timeout) + one busy-retry interval + a rebalance
    allowance; no execution starts before the dead container's lease expired.
    """
    lease = SESSION_TIMEOUT + 4.0
    kafka_server.create_topics([kafka_names.topic, kafka_names.dead_letters], partitions=1)
    common = ("--session-timeout", str(SESSION_TIMEOUT))
    env = {"LW_TEST_LEASE": str(lease), "LW_TEST_SLOW_POD": "ka"}
    a = containers("ka", *common, **env)
    await _ready(a)
    b = containers("kb", *common, **env)
    await _ready(b)
    keys = ["k1", "k2", "k3"]
    await produce(
        kafka_server.bootstrap_servers,
        kafka_names.topic,
        [(key.encode(), payload(seconds=60)) for key in keys],
    )

    async def all_started() -> bool:
        return {e.job_key for e in recorded([a])} == set(keys)

    await eventually(all_started, within=30)
    assert {e.pod for e in recorded([a, b])} == {a.pod}  # a owned the one partition
    killed_at = time.monotonic()
    engine("kill", "--signal", "KILL", a.name)
    leases = RedisLeases(redis, namespace=namespace)
    expires = {}
    for key in keys:
        read_at = time.monotonic()
        expires[key] = read_at + await redis.pttl(leases.lease_key(key)) / 1000

    async def all_completed() -> bool:
        return {e.job_key for e in recorded([b]) if e.outcome == "completed"} == set(keys)

    await eventually(all_completed, within=60)
    await _all_committed(kafka_server, kafka_names, {0: len(keys)})
    executions = recorded([a, b])
    takeovers = {e.job_key: e.start for e in executions if e.pod == b.pod}
    assert takeovers.keys() == set(keys)
    bound = max(lease, SESSION_TIMEOUT) + BUSY_RETRY_CAP + REBALANCE_ALLOWANCE
    late = max(takeovers.values()) - killed_at
    print(f"container takeover after SIGKILL: {late:.2f}s (bound {bound:.1f}s)")
    assert late <= bound
    for key, started in takeovers.items():
        assert started >= expires[key] - 0.05, key
    assert overlapping(executions, killed_at={a.pod: killed_at}) == []
    assert re.search(r"exited|Exited", engine("ps", "-a", "--filter", f"name={a.name}").stdout)
