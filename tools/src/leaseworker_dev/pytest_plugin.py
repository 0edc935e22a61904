"""pytest fixtures for testing your jobs against real services: Redis, Kafka, an embedded pod.

Installed with leaseworker-dev as the ``leaseworker`` pytest plugin (a ``pytest11``
entry point; ``-p no:leaseworker`` turns it off). It only defines fixtures, and
nothing starts until a test asks for one:

- ``leaseworker_stack``: the session's local services (leaseworker's one
  stack builder); each starts on first use, all stop at the session's end;
- ``leaseworker_redis``: a private ``redis-server`` on a free loopback port,
  once per session (``.url``);
- ``leaseworker_kafka``: a private single-node Kafka broker (KRaft), once per
  session (``.bootstrap_servers``); it needs Java, and fetches the broker's
  jars into a cache on first use;
- ``leaseworker_topic``: a fresh trigger topic (and its ``.dead-letter``
  topic) on that broker, per test;
- ``leaseworker_pod``: runs your job class in a pod inside the test's event
  loop, on that topic, Redis and an in-memory SQLite completion store::

      async def test_the_report_completes(leaseworker_pod):
          async with leaseworker_pod(MonthlyReport) as pod:
              result = await pod.send({"tenant": "acme", "period": "2026-11"})
          assert result.outcome == "completed"

Services are stopped by PID at the end of the session and their temporary
directories removed. It uses the local services (``leaseworker_dev._services``)
only inside the fixtures: loading the plugin imports neither them nor aiokafka
(the embedded pod lives in ``_embedded``); see docs/testing.md.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from leaseworker.toolkit import DEAD_LETTER_SUFFIX as DEAD_LETTER_SUFFIX

if TYPE_CHECKING:
    from ._embedded import EmbeddedPod as EmbeddedPod
    from ._embedded import PodFactory as PodFactory
    from ._services import LocalKafka, LocalRedis, LocalStack


@pytest.fixture(scope="session")
def leaseworker_stack() -> Iterator[LocalStack]:
    """Provide the session's local services: each starts on first use, all stop at its end."""
    from ._services import LocalStack

    with LocalStack() as stack:
        yield stack


@pytest.fixture(scope="session")
def leaseworker_redis(leaseworker_stack: LocalStack) -> LocalRedis:
    """Start a private redis-server for the session (``.url``)."""
    return leaseworker_stack.redis


@pytest.fixture(scope="session")
def leaseworker_kafka(leaseworker_stack: LocalStack) -> LocalKafka:
    """Start a private Kafka broker for the session (``.bootstrap_servers``)."""
    return leaseworker_stack.kafka


@pytest.fixture
def leaseworker_topic(leaseworker_kafka: LocalKafka) -> str:
    """Create a one-partition trigger topic of the test's own, and ``<topic>.dead-letter``."""
    topic = f"leaseworker-test-{uuid.uuid4().hex[:12]}"
    leaseworker_kafka.create_topics([topic, topic + DEAD_LETTER_SUFFIX])
    return topic


@pytest.fixture
def leaseworker_pod(
    leaseworker_kafka: LocalKafka, leaseworker_redis: LocalRedis, leaseworker_topic: str
) -> PodFactory:
    """Return a factory of embedded pods on the test's topic: see :class:`PodFactory`."""
    from ._embedded import EmbeddedPod as EmbeddedPod
    from ._embedded import PodFactory as PodFactory

    return PodFactory(leaseworker_kafka, leaseworker_redis, leaseworker_topic)


def __getattr__(name: str) -> Any:
    """``PodFactory`` and ``EmbeddedPod`` (for annotations) load on first use (PEP 562)."""
    if name in ("PodFactory", "EmbeddedPod"):
        from . import _embedded

        return getattr(_embedded, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
