"""Fixtures of the pod tests: real ``leaseworker run`` processes on the test's services."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from leaseworker_dev._services import LocalKafka, LocalRedis, PodProcess

from ..kafka_util import KafkaNames
from ..pods import LEASE, SESSION_TIMEOUT, spawn_pod


@pytest.fixture
def pods(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    tmp_path: Path,
) -> Iterator[Callable[..., PodProcess]]:
    """Start MarkerJob pods of this test's group (``pods(name, *flags, **env)``).

    Each consumes the test's topic with the session's Redis, a
    :data:`SESSION_TIMEOUT` group session and a :data:`LEASE` lease unless
    ``env`` says otherwise; every pod still running at the end is SIGKILLed.
    """
    started: list[PodProcess] = []
    env = {
        "LEASEWORKER_BOOTSTRAP_SERVERS": kafka_server.bootstrap_servers,
        "LEASEWORKER_REDIS_URL": redis_server.url,
        "LEASEWORKER_GROUP": kafka_names.group,
        "LEASEWORKER_NAMESPACE": namespace,
        "LEASEWORKER_SESSION_TIMEOUT": str(SESSION_TIMEOUT),
        "LW_TEST_TOPIC": kafka_names.topic,
        "LW_TEST_LEASE": str(LEASE),
    }

    def start(name: str, *extra: str, **more_env: str) -> PodProcess:
        pod = spawn_pod(name, tmp_path, {**env, **more_env}, *extra)
        started.append(pod)
        return pod

    yield start
    for pod in started:
        pod.kill()
