"""ACLs for the local Kafka broker, and the least privilege a pod needs (``pod_acls``).

A pod consumes its job topic in its group, commits offsets there, and
produces dead letters: ``Read`` on the group, ``Read`` on the job topic,
``Write`` on the dead-letter topic, each literal (``Read`` and ``Write``
imply ``Describe``, which metadata and offset fetches need). Nothing on the
cluster: the pod's producer is not idempotent and creates no topics.
aiokafka's admin client has no ACL calls; its protocol layer has the
CreateAcls and DescribeAcls requests, sent here over the broker's own
``PLAINTEXT`` listener, whose principal is a super user.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import anyio
from aiokafka.errors import for_code  # type: ignore[import-untyped]
from aiokafka.protocol.admin import (  # type: ignore[import-untyped]
    CreateAclsRequest,
    DescribeAclsRequest,
)

from leaseworker.toolkit import KafkaSecurity, started_admin

RESOURCE_TYPES = {"topic": 2, "group": 3, "cluster": 4}
"""Kafka's ``ResourceType`` codes."""

OPERATIONS = {"read": 3, "write": 4, "create": 5, "describe": 8}
"""Kafka's ``AclOperation`` codes."""

_LITERAL = 3
_ANY = 1
_ALLOW = 3


@dataclass(frozen=True, slots=True)
class Acl:
    """One ``ALLOW`` binding: ``principal`` may do ``operation`` on a resource (literal name)."""

    principal: str
    operation: str
    resource_type: str
    resource_name: str

    def __str__(self) -> str:
        return f"{self.principal} {self.operation} on {self.resource_type} {self.resource_name}"


def pod_acls(principal: str, *, group: str, topic: str, dead_letter_topic: str | None) -> list[Acl]:
    """Return exactly what a pod of ``group`` consuming ``topic`` needs (see the module doc)."""
    user = principal if ":" in principal else f"User:{principal}"
    acls = [Acl(user, "read", "group", group), Acl(user, "read", "topic", topic)]
    if dead_letter_topic:
        acls.append(Acl(user, "write", "topic", dead_letter_topic))
    return acls


async def create_acls(bootstrap_servers: str, acls: Sequence[Acl], *, within: float) -> None:
    """Create ``acls`` and wait until the broker's authorizer applies them.

    The controller commits ACLs to the metadata log; the broker's authorizer
    applies them a moment later, so this polls DescribeAcls (answered from the
    authorizer) until every principal lists as many bindings as were asked for.
    """
    admin_client = started_admin(
        bootstrap_servers, security=KafkaSecurity(), within=within, client_id="leaseworker-acls"
    )
    with anyio.fail_after(within):
        async with admin_client as admin:
            for acl in acls:
                request = CreateAclsRequest(
                    RESOURCE_TYPES[acl.resource_type],
                    acl.resource_name,
                    _LITERAL,
                    acl.principal,
                    "*",
                    OPERATIONS[acl.operation],
                    _ALLOW,
                )
                response = await admin._send_request(request)
                for code, message in response.creation_responses:
                    if code:
                        raise for_code(code)(f"creating ACL {acl}: {message}")
            for principal in {acl.principal for acl in acls}:
                wanted = sum(1 for acl in acls if acl.principal == principal)
                while len(await _bindings(admin, principal)) < wanted:  # noqa: ASYNC110
                    await anyio.sleep(0.05)


async def _bindings(admin: object, principal: str) -> list[object]:
    """Return the resources with ACLs of ``principal`` (one entry per binding)."""
    request = DescribeAclsRequest(
        resource_type=_ANY,
        resource_name=None,
        resource_pattern_type_filter=_ANY,
        principal=principal,
        host=None,
        operation=_ANY,
        permission_type=_ANY,
    )
    response = await admin._send_request(request)  # type: ignore[attr-defined]
    if response.error_code:
        raise for_code(response.error_code)(response.error_message)
    return [acl for resource in response.resources for acl in resource[-1]]
