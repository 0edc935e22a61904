"""``leaseworker run --process-workers``: the pool a real pod starts, and none with 0."""

from __future__ import annotations

import json
from collections.abc import Callable

import anyio
import pytest

from leaseworker._cli import main
from leaseworker_dev._services import LocalKafka, LocalRedis, PodProcess

from ..kafka_util import KafkaNames, produce
from ..pods import ready, recorded
from ..processes import pool_processes
from ..waiting import eventually


@pytest.mark.parametrize(("workers", "children"), [("0", 0), ("1", 2)])
async def test_a_pod_starts_its_workers_and_the_keeper_before_consuming_and_none_with_0(
    kafka_server: LocalKafka,
    kafka_names: KafkaNames,
    pods: Callable[..., PodProcess],
    workers: str,
    children: int,
    redis_server: LocalRedis,
    namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Ready means consuming: by then the pool is warm (1 worker and its keeper), or absent.

    With 0 a job that calls ``ctx.run_in_process`` fails that execution with a
    one-line ConfigError naming the flag (logged: leaseworker wrote it), and
    the pod is still without children afterwards; with 1 the same trigger
    completes, and ``inspect`` shows what its child cost.
    """
    kafka_server.create_topics([kafka_names.topic], partitions=1)
    started = pods("pod-a", "--process-workers", workers)
    await eventually(lambda: ready(started), within=60)
    assert len(pool_processes(started.process.pid)) == children
    body = json.dumps({"add": [1, 2]}).encode()
    await produce(kafka_server.bootstrap_servers, kafka_names.topic, [(b"sum", body)])

    async def ended() -> bool:
        return any(e.outcome for e in recorded([started]))

    await eventually(ended, within=60)
    (execution,) = recorded([started])
    if workers == "1":
        assert execution.outcome == "completed"
        argv = ["inspect", execution.job_key, "--redis-url", redis_server.url]
        assert await anyio.to_thread.run_sync(main, [*argv, "--namespace", namespace]) == 0
        shown = json.loads(capsys.readouterr().out)["completion"]  # the pod's store: its env
        assert shown["execution_id"] == execution.execution_id
        assert shown["cpu_seconds"] is not None  # what its child spent (0.0 at this size)
        assert shown["peak_memory"] > 0
        return
    assert execution.outcome == "failed"
    (line,) = [line for line in started.log_text().splitlines() if "ConfigError" in line]
    assert "run_in_process(add) has no process worker to run in" in line
    assert "--process-workers 0" in line
    assert "Traceback" not in started.log_text()
    assert pool_processes(started.process.pid) == []
