"""``create_topics``: create topics and wait until they can be used (``leaseworker topics``).

One admin client (``started_admin``), one CreateTopics request, then
metadata polls until every partition has a leader, so a producer started
right after never sees ``LEADER_NOT_AVAILABLE``. The local Kafka of the demo and the tests creates
its topics through this too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import anyio
from aiokafka.admin import NewTopic  # type: ignore[import-untyped]
from aiokafka.errors import TopicAlreadyExistsError, for_code  # type: ignore[import-untyped]

from ._admin import started_admin
from ._security import KafkaSecurity

MAX_DEFAULT_REPLICATION = 3
"""The replication factor used when none is given, capped by the number of brokers."""


async def create_topics(
    bootstrap_servers: str,
    names: Sequence[str],
    *,
    partitions: int = 1,
    replication_factor: int | None = None,
    exist_ok: bool = False,
    configs: Mapping[str, str] | None = None,
    within: float = 30.0,
    security: KafkaSecurity | None = None,
) -> None:
    """Create ``names`` within ``within`` seconds and wait for their partition leaders.

    ``replication_factor`` defaults to the number of brokers, at most
    :data:`MAX_DEFAULT_REPLICATION`. ``configs`` are topic-level settings
    (``{"retention.ms": "86400000"}``). Raises the broker's refusal as an
    aiokafka ``KafkaError`` (``TopicAlreadyExistsError`` unless ``exist_ok``;
    ``InvalidPartitionsError``, ``InvalidReplicationFactorError``, ...) and
    ``TimeoutError`` when the broker does not answer in time.
    """
    admin_client = started_admin(
        bootstrap_servers,
        security=security or KafkaSecurity(),
        within=within,
        client_id="leaseworker-topics",
    )
    with anyio.fail_after(within):
        async with admin_client as admin:
            if replication_factor is None:
                brokers = (await admin.describe_cluster())["brokers"]
                replication_factor = max(1, min(MAX_DEFAULT_REPLICATION, len(brokers)))
            settings = dict(configs or {})
            new = [
                NewTopic(n, partitions, replication_factor, topic_configs=settings) for n in names
            ]
            _raise_refusals(await admin.create_topics(new), exist_ok=exist_ok)
            # Leaders appear in the broker's metadata, which nothing pushes: poll it.
            while not _all_led(await admin.describe_topics(list(names)), names):  # noqa: ASYNC110
                await anyio.sleep(0.05)


def _raise_refusals(response: Any, *, exist_ok: bool) -> None:
    """Raise the first topic error of a CreateTopics response (bar "exists" when allowed)."""
    for topic_error in response.topic_errors:
        topic, code = topic_error[0], topic_error[1]
        message = topic_error[2] if len(topic_error) > 2 else None
        if code == 0:
            continue
        error = for_code(code)
        if exist_ok and error is TopicAlreadyExistsError:
            continue
        raise error(f"creating topic {topic!r}" + (f": {message}" if message else ""))


def _all_led(described: list[dict[str, Any]], names: Sequence[str]) -> bool:
    """Tell whether metadata shows every topic in ``names`` with a leader everywhere."""
    ready = {
        topic["topic"]
        for topic in described
        if topic["error_code"] == 0
        and topic["partitions"]
        and all(partition["leader"] >= 0 for partition in topic["partitions"])
    }
    return ready.issuperset(names)
