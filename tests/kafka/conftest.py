"""The Kafka tests' own broker, which they may stop, restart and let create topics."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from leaseworker_dev._services import LocalKafka


@pytest.fixture(scope="package")
def own_kafka() -> Iterator[LocalKafka]:
    """A broker apart from the session's: outage tests take it down; it creates topics on use.

    ``auto.create.topics.enable=true``, unlike the session's broker, so the
    start-up topic check can be shown to let such a broker create the topics;
    tests that need a topic still create it first.
    """
    server = LocalKafka.start(settings={"auto.create.topics.enable": "true"})
    yield server
    server.stop()
