"""Checking at start that the pod's topics exist: a missing one is a setting, not an outage.

Without the check a missing job topic leaves the pod "joining" while aiokafka
logs an error a few times a second, and a missing dead-letter topic stalls its
partition at the first dead letter. Unless the brokers create topics on first
use (``auto.create.topics.enable``), :func:`require_topics` raises
:class:`~leaseworker.ConfigError` naming them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import anyio
from aiokafka.admin.config_resource import (  # type: ignore[import-untyped]
    ConfigResource,
    ConfigResourceType,
)

from .._errors import ConfigError
from ._admin import started_admin
from ._logs import logger
from ._security import KafkaSecurity

AUTO_CREATE = "auto.create.topics.enable"
"""The broker setting under which a consumer or producer creates a topic by naming it."""


async def require_topics(
    topics: Iterable[str],
    *,
    bootstrap_servers: str,
    security: KafkaSecurity,
    within: float,
    client_id: str = "leaseworker-topic-check",
) -> None:
    """Raise ConfigError if a topic of ``topics`` does not exist and brokers do not create it.

    One admin client (``started_admin``) lists the topics and, only when one is missing, asks a
    broker for its ``auto.create.topics.enable``; all within ``within``
    seconds. Kafka errors and timeouts propagate: a pod retries those (the
    brokers may not be up yet).
    """
    admin_client = started_admin(
        bootstrap_servers, security=security, within=within, client_id=client_id
    )
    with anyio.fail_after(within):
        async with admin_client as admin:
            listed = set(await admin.list_topics())
            missing = sorted({topic for topic in topics if topic not in listed})
            if missing and await _auto_creates(admin):
                logger.info(
                    "topic(s) %s do not exist yet; the brokers create topics on first use (%s)",
                    ", ".join(missing),
                    AUTO_CREATE,
                    extra={"event": "topics_auto_created"},
                )
                return
    if missing:
        raise ConfigError(
            f"{_kind(missing)} {_names(missing)} not found on Kafka at "
            f"{bootstrap_servers}, and the brokers do not create topics "
            f"({AUTO_CREATE}=false): create {_it(missing)} first"
        )


async def _auto_creates(admin: Any) -> bool:
    """Ask one broker whether it creates topics on first use (``auto.create.topics.enable``)."""
    cluster = await admin.describe_cluster()
    broker = str(cluster["brokers"][0]["node_id"])
    resource = ConfigResource(ConfigResourceType.BROKER, broker, {AUTO_CREATE: None})
    [response] = await admin.describe_configs([resource])
    return _setting(response, AUTO_CREATE) == "true"


def _setting(response: Any, name: str) -> str | None:
    """Return the value of ``name`` in a DescribeConfigs response (``None``: not listed)."""
    for resource in response.resources:
        for entry in resource[4]:  # (error code, message, type, name, config entries)
            if entry[0] == name:
                return str(entry[1]).lower()
    return None


def _names(topics: list[str]) -> str:
    return ", ".join(repr(topic) for topic in topics)


def _kind(topics: list[str]) -> str:
    return "topic" if len(topics) == 1 else "topics"


def _it(topics: list[str]) -> str:
    return "it" if len(topics) == 1 else "them"
