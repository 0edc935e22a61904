"""Pod pods as separate ``leaseworker run`` processes: scale-out, SIGKILL, SIGTERM."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

from redis.asyncio import Redis

from leaseworker import RedisLeases
from leaseworker_dev._services import LocalKafka, PodProcess

from ..kafka_util import KafkaNames, committed, payload, produce
from ..pods import SESSION_TIMEOUT, overlapping, ready, recorded
from ..waiting import eventually

BUSY_RETRY_CAP = 5.0  # ReportJob.busy_backoff default cap
REBALANCE_ALLOWANCE = 3.0  # heartbeat + JoinGroup/SyncGroup + offset fetch + first poll


def _started(pods: dict[str, PodProcess]) -> set[str]:
    """The job keys any of the pods started (acquired) so far."""
    return {e.job_key for e in recorded(list(pods.values()))}


async def test_two_pods_run_200_triggers_over_50_keys_without_overlap(
    kafka_server: LocalKafka,
    kafka_names: KafkaNames,
    pods: Callable[..., PodProcess],
) -> None:
    """Every key completes, no two executions of a key overlap (one clock), all 200 committed.

    Exact duplicates are answered from the completion store without running.
    """
    kafka_server.create_topics([kafka_names.topic], partitions=4)
    first, second = pods("pod-a", "--concurrency", "4"), pods("pod-b", "--concurrency", "4")
    await eventually(lambda: ready(first), within=30)
    await eventually(lambda: ready(second), within=30)
    keys = [f"report:{i % 50}" for i in range(200)]
    # Two report versions per key (i // 100), each sent twice: 100 distinct requests,
    # 100 exact duplicates that the completion store answers without running.
    await produce(
        kafka_server.bootstrap_servers,
        kafka_names.topic,
        [(key.encode(), payload(seconds=0.05, version=i // 100)) for i, key in enumerate(keys)],
    )

    async def all_committed() -> bool:
        found = await committed(
            kafka_server.bootstrap_servers, kafka_names.group, kafka_names.topic
        )
        return sum(found.values()) == len(keys)

    await eventually(all_committed, within=90)
    executions = recorded([first, second])
    completed = [e for e in executions if e.outcome == "completed"]
    assert {e.job_key for e in completed} == set(keys)
    assert overlapping(executions) == []
    assert len(completed) >= 100  # every distinct request ran
    assert {e.pod for e in completed} == {"pod-a", "pod-b"}  # both pods did work
    for pod in (first, second):
        assert "Traceback" not in pod.log_text()


async def test_sigkilled_pod_is_taken_over_after_session_timeout_and_lease_expiry(
    kafka_server: LocalKafka,
    kafka_names: KafkaNames,
    pods: Callable[..., PodProcess],
    redis: Redis,
    namespace: str,
) -> None:
    """After SIGKILL mid-job, the other pod completes every trigger within the takeover bound.

    Bound: max(lease_duration, session_timeout) + one busy-retry interval + a
    rebalance allowance. No trigger is lost, no execution overlaps the killed
    one's, and none starts before the dead pod's lease key expired in Redis.
    The lease here outlives the session timeout, so the new owner of the
    partition does meet the old leases and must wait them out.
    """
    lease = SESSION_TIMEOUT + 4.0
    kafka_server.create_topics([kafka_names.topic], partitions=1)
    a = pods("pod-a", LW_TEST_SLOW_POD="pod-a", LW_TEST_LEASE=str(lease))
    await eventually(lambda: ready(a), within=30)
    b = pods("pod-b", LW_TEST_SLOW_POD="pod-a", LW_TEST_LEASE=str(lease))
    await eventually(lambda: ready(b, idle=True), within=30)
    keys = ["k1", "k2", "k3"]
    await produce(
        kafka_server.bootstrap_servers,
        kafka_names.topic,
        [(key.encode(), payload(seconds=60)) for key in keys],
    )

    async def all_started_on_a() -> bool:
        return _started({"pod-a": a}) == set(keys)

    await eventually(all_started_on_a, within=20)
    killed_at = time.monotonic()
    a.kill()
    leases = RedisLeases(redis, namespace=namespace)
    expires = {}  # when each dead lease key expires, on this host's monotonic clock
    for key in keys:
        read_at = time.monotonic()
        expires[key] = read_at + await redis.pttl(leases.lease_key(key)) / 1000
        assert expires[key] > killed_at + SESSION_TIMEOUT - 2  # the leases outlive the session

    async def all_completed() -> bool:
        return {e.job_key for e in recorded([a, b]) if e.outcome == "completed"} == set(keys)

    await eventually(all_completed, within=40)

    async def committed_all() -> bool:
        found = await committed(
            kafka_server.bootstrap_servers, kafka_names.group, kafka_names.topic
        )
        return found == {0: len(keys)}

    await eventually(committed_all, within=10)
    executions = recorded([a, b])
    takeovers = {e.job_key: e.start for e in executions if e.pod == "pod-b"}
    assert takeovers.keys() == set(keys)
    bound = max(lease, SESSION_TIMEOUT) + BUSY_RETRY_CAP + REBALANCE_ALLOWANCE
    late = max(takeovers.values()) - killed_at
    print(f"takeover after SIGKILL: {late:.2f}s (bound {bound:.1f}s)")
    assert late <= bound
    for key, started in takeovers.items():  # nobody acquired while the dead pod's lease held
        assert started >= expires[key] - 0.05, key
    assert overlapping(executions, killed_at={"pod-a": killed_at}) == []


async def test_sigterm_drains_then_cancels_releases_commits_and_exits_zero(
    kafka_server: LocalKafka,
    redis: Redis,
    namespace: str,
    kafka_names: KafkaNames,
    pods: Callable[..., PodProcess],
) -> None:
    """SIGTERM: the short job finishes and is committed, the long one is cancelled.

    The long one is cancelled at the shutdown timeout, its lease released and
    its trigger left uncommitted; the exit code is 0.
    """
    kafka_server.create_topics([kafka_names.topic], partitions=1)
    pod = pods("pod-a", "--shutdown-timeout", "2", "--concurrency", "2", LW_TEST_LEASE="10")
    await eventually(lambda: ready(pod), within=30)
    await produce(
        kafka_server.bootstrap_servers,
        kafka_names.topic,
        [(b"short", payload(seconds=1)), (b"long", payload(seconds=60))],
    )

    async def both_started() -> bool:
        return _started({"pod-a": pod}) == {"short", "long"}

    await eventually(both_started, within=20)
    signalled = time.monotonic()
    pod.signal(signal.SIGTERM)
    assert await pod.wait_exit(within=10) == 0
    exited = time.monotonic() - signalled
    stops = {e.job_key: e.outcome for e in recorded([pod])}
    assert stops == {"short": "completed", "long": "cancelled"}
    assert 2 <= exited < 2 + 3  # drained for the timeout, then released, committed, left
    info = await RedisLeases(redis, namespace=namespace).inspect("long")
    assert info.owner is None  # released, not left to expire (its TTL was 10 s)
    found = await committed(kafka_server.bootstrap_servers, kafka_names.group, kafka_names.topic)
    assert found == {0: 1}  # "short" only: "long" reached no terminal outcome


async def test_a_second_sigterm_exits_at_once(
    kafka_server: LocalKafka,
    kafka_names: KafkaNames,
    pods: Callable[..., PodProcess],
) -> None:
    """The second SIGTERM does not wait for the shutdown timeout: exit 143 right away."""
    kafka_server.create_topics([kafka_names.topic], partitions=1)
    pod = pods("pod-a", "--shutdown-timeout", "30")
    await eventually(lambda: ready(pod), within=30)
    await produce(kafka_server.bootstrap_servers, kafka_names.topic, [(b"k", payload(seconds=60))])

    async def started() -> bool:
        return _started({"pod-a": pod}) == {"k"}

    await eventually(started, within=20)
    pod.signal(signal.SIGTERM)
    await eventually(lambda: _logged(pod, "draining"), within=5)
    signalled = time.monotonic()
    pod.signal(signal.SIGTERM)
    assert await pod.wait_exit(within=5) == 128 + signal.SIGTERM
    assert time.monotonic() - signalled < 2


async def _logged(pod: PodProcess, text: str) -> bool:
    return text in pod.log_text()
