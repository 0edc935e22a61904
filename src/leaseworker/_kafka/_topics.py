"""Checking at start that the pod's topics exist: a missing one is a setting, not an outage.

Without the check a missing job topic leaves the pod "joining" while aiokafka
logs an error a few times a second, and a missing dead-letter topic stalls its
partition at the first dead letter. Unless the brokers create topics on first
use (``auto.create.topics.enable``), :func:`require_topics` raises
:class:`~leaseworker.ConfigError` naming them. Under ACLs a topic the
principal may not describe is not listed either: it is named as not
authorized instead, and so is a group the principal may not ``Read``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import anyio
from aiokafka.admin.config_resource import (  # type: ignore[import-untyped]
    ConfigResource,
    ConfigResourceType,
)
from aiokafka.errors import GroupAuthorizationFailedError  # type: ignore[import-untyped]

from .._errors import ConfigError
from ._admin import started_admin
from ._log_names import logger
from ._security import KafkaSecurity

_TOPIC_NOT_AUTHORIZED = 29
_GROUP_NOT_AUTHORIZED = 30
_ALL, _READ = 2, 3  # AclOperation codes, bits of "authorized operations"
_V3_FIELDS = 7  # a DescribeGroups v3 group: error, id, state, protocol type/name, members, ops

AUTO_CREATE = "auto.create.topics.enable"
"""The broker setting under which a consumer or producer creates a topic by naming it."""


async def require_topics(
    topics: Iterable[str],
    *,
    bootstrap_servers: str,
    security: KafkaSecurity,
    within: float,
    client_id: str = "leaseworker-topic-check",
    group: str | None = None,
) -> None:
    """Raise ConfigError if a topic of ``topics`` does not exist and brokers do not create it.

    One admin client (``started_admin``) lists the topics and, only when one is missing, asks
    the brokers whether it is hidden by ACLs and whether they create topics
    (``auto.create.topics.enable``); with ``group``, whether the principal may
    ``Read`` it; all within ``within`` seconds. Refused credentials and
    missing ACLs raise ConfigError; other Kafka errors and timeouts
    propagate: a pod retries those (the brokers may not be up yet).
    """
    admin_client = started_admin(
        bootstrap_servers, security=security, within=within, client_id=client_id
    )
    with anyio.fail_after(within):
        async with admin_client as admin:
            listed = set(await admin.list_topics())
            missing = sorted({topic for topic in topics if topic not in listed})
            if missing:
                _raise_unauthorized(bootstrap_servers, await admin.describe_topics(missing))
            if group is not None:
                await require_group(admin, group, bootstrap_servers)
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


def _raise_unauthorized(bootstrap_servers: str, described: list[dict[str, Any]]) -> None:
    """Raise ConfigError naming the topics metadata reports as not authorized."""
    hidden = sorted(t["topic"] for t in described if t["error_code"] == _TOPIC_NOT_AUTHORIZED)
    if hidden:
        raise ConfigError(
            f"Kafka at {bootstrap_servers} refused access: not authorized to describe "
            f"{_kind(hidden)} {_names(hidden)} (grant the pod's principal Read on its job "
            "topic and Write on its dead-letter topic)"
        )


async def require_group(admin: Any, group: str, bootstrap_servers: str) -> None:
    """Raise ConfigError if the principal may not use the consumer group ``group``.

    Finding the group's coordinator needs ``Describe`` on it (``Read`` grants
    it): a principal with no ACL on the group fails here, at start, rather
    than in the poll loop. Where the broker reports the principal's
    operations on the group (DescribeGroups v3+), ``Read`` itself is checked.
    """
    try:
        [response] = await admin.describe_consumer_groups(
            [group], include_authorized_operations=True
        )
        [described] = response.groups
    except GroupAuthorizationFailedError:
        described = (_GROUP_NOT_AUTHORIZED,)
    refused = described[0] == _GROUP_NOT_AUTHORIZED
    if len(described) >= _V3_FIELDS and isinstance(described[-1], int) and described[-1] >= 0:
        refused = refused or not described[-1] & (1 << _READ | 1 << _ALL)
    if refused:
        raise ConfigError(
            f"Kafka at {bootstrap_servers} refused access: not authorized to read "
            f"consumer group {group!r} (grant the pod's principal Read on it)"
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
