"""Changing a SCRAM user's password on the running local broker (a rotated credential).

KRaft keeps SCRAM credentials in the metadata log; besides ``kafka-storage
format --add-scram`` (``_kafka_secure``), the one way to change them is the
AlterUserScramCredentials request (KIP-554), which aiokafka's admin client
does not offer. Its protocol layer can carry it: the request is declared
here, the salted password computed as the broker stores it (PBKDF2 of the
password, RFC 5802), and sent over the broker's own ``PLAINTEXT`` listener,
as the ACLs are (``_kafka_acls``). The broker replaces the user's credential:
a new login needs the new password, connections already authenticated stay.
"""

from __future__ import annotations

import hashlib
import secrets

import anyio
from aiokafka.errors import for_code  # type: ignore[import-untyped]
from aiokafka.protocol.api import Request, RequestStruct, Response  # type: ignore[import-untyped]
from aiokafka.protocol.types import (  # type: ignore[import-untyped]
    CompactArray,
    CompactBytes,
    CompactString,
    Int8,
    Int16,
    Int32,
    Schema,
    TaggedFields,
)

from leaseworker.toolkit import KafkaSecurity, started_admin

MECHANISMS = {"SCRAM-SHA-256": (1, "sha256"), "SCRAM-SHA-512": (2, "sha512")}
"""Kafka's ``ScramMechanism`` codes, and the hash each one salts with."""

ITERATIONS = 4096
"""PBKDF2 iterations: the least the broker accepts."""


class _AlterUserScramCredentialsResponse(Response):  # type: ignore[misc]
    API_KEY = 51
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "results",
            CompactArray(
                ("user", CompactString("utf-8")),
                ("error_code", Int16),
                ("error_message", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _AlterUserScramCredentialsRequest(RequestStruct):  # type: ignore[misc]
    API_KEY = 51
    API_VERSION = 0
    FLEXIBLE_VERSION = True
    RESPONSE_TYPE = _AlterUserScramCredentialsResponse
    SCHEMA = Schema(
        (
            "deletions",
            CompactArray(
                ("name", CompactString("utf-8")), ("mechanism", Int8), ("tags", TaggedFields)
            ),
        ),
        (
            "upsertions",
            CompactArray(
                ("name", CompactString("utf-8")),
                ("mechanism", Int8),
                ("iterations", Int32),
                ("salt", CompactBytes),
                ("salted_password", CompactBytes),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _AlterUserScramCredentials(Request[_AlterUserScramCredentialsRequest]):  # type: ignore[misc]
    """The request as aiokafka's connections send it (v0, the one version there is)."""

    API_KEY = 51

    def __init__(self, upsertions: list[tuple[object, ...]]) -> None:
        self._upsertions = upsertions

    def build(self, request_struct_class: type[RequestStruct]) -> RequestStruct:
        return request_struct_class([], self._upsertions, {})


async def set_scram_password(
    bootstrap_servers: str, user: str, password: str, *, within: float
) -> None:
    """Give ``user`` ``password`` for every SCRAM mechanism (replacing the old one).

    Raises the broker's error (an aiokafka ``KafkaError``) naming the user, never the password.
    """
    admin_client = started_admin(
        bootstrap_servers, security=KafkaSecurity(), within=within, client_id="leaseworker-scram"
    )
    with anyio.fail_after(within):
        async with admin_client as admin:
            for code, digest in MECHANISMS.values():  # one user once per request: one each
                salt = secrets.token_bytes(16)
                salted = hashlib.pbkdf2_hmac(digest, password.encode(), salt, ITERATIONS)
                upsertion: tuple[object, ...] = (user, code, ITERATIONS, salt, salted, {})
                response = await admin._send_request(_AlterUserScramCredentials([upsertion]))
                for name, error, message, _tags in response.results:
                    if error:
                        raise for_code(error)(f"setting the SCRAM password of {name!r}: {message}")
