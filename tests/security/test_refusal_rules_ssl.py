"""Which Kafka failures are refusals (exit 2) and which are outages (retry): the rules alone.

The real peers are in ``test_kafka_sasl_ssl``; these pin the classification
the pod relies on, including what must keep being retried.
"""

from __future__ import annotations

import ssl

import pytest
from aiokafka.errors import (  # type: ignore[import-untyped]
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    NodeNotReadyError,
    SaslAuthenticationFailed,
)

from leaseworker import KafkaSecurity
from leaseworker._kafka._refusals import _hosts, refusal

SECRET = "never-shown-0123456789"
SASL = KafkaSecurity(
    protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256", sasl_username="pod", sasl_password=SECRET
)


@pytest.mark.parametrize(
    ("exc", "said"),
    [
        (
            SaslAuthenticationFailed("invalid credentials"),
            "SASL authentication failed for user 'pod'",
        ),
        (GroupAuthorizationFailedError("group-1"), "not authorized: group-1"),
        (
            ssl.SSLError(1, "[SSL: SSLV3_ALERT_BAD_CERTIFICATE] sslv3 alert bad certificate"),
            "client's TLS",
        ),
    ],
)
def test_sasl_and_ssl_refusals_are_named_without_the_password(
    exc: BaseException, said: str
) -> None:
    """Each refusal gets a reason naming what was refused; the password is never in it."""
    reason = refusal(exc, SASL)
    assert reason is not None
    assert said in reason
    assert SECRET not in reason


@pytest.mark.parametrize(
    "exc",
    [
        KafkaConnectionError("Unable to bootstrap"),
        NodeNotReadyError("starting"),
        ConnectionRefusedError(111, "refused"),
        TimeoutError(),
        ssl.SSLEOFError(8, "EOF occurred in violation of protocol"),
    ],
)
def test_outages_over_ssl_are_not_refusals(exc: BaseException) -> None:
    """A broker down, starting, hung or cut mid-handshake is waited for."""
    assert refusal(exc, SASL) is None


def test_bootstrap_servers_are_split_as_kafka_reads_them_ssl() -> None:
    """``host:port`` lists, a default port, IPv6 in brackets."""
    assert _hosts("a:1, b:2,,[::1]:3,c") == [("a", 1), ("b", 2), ("::1", 3), ("c", 9092)]
