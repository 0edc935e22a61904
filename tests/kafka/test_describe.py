"""``describe``: how Kafka errors read in log lines and CLI errors."""

from __future__ import annotations

from aiokafka.errors import (  # type: ignore[import-untyped]
    KafkaConnectionError,
    TopicAlreadyExistsError,
)

from leaseworker._kafka._log_names import describe


def test_a_kafka_error_is_named_once() -> None:
    """The type is not repeated: aiokafka's own ``str()`` starts with it (and ``[Error N]``)."""
    assert describe(KafkaConnectionError("Unable to bootstrap from x")) == (
        "KafkaConnectionError: Unable to bootstrap from x"
    )
    assert describe(TopicAlreadyExistsError("creating topic 't'")) == (
        "TopicAlreadyExistsError: creating topic 't'"
    )
    assert describe(KafkaConnectionError()) == "KafkaConnectionError"


def test_other_errors_read_type_and_message() -> None:
    """Other errors read as type and message; a timeout of ours as no answer in time."""
    assert describe(ConnectionRefusedError("refused")) == "ConnectionRefusedError: refused"
    assert describe(TimeoutError()) == "no answer in time"
