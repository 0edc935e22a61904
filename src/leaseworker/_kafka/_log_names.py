"""How the Kafka layer's log lines name things: its logger, partitions, errors.

Every module of the source logs to ``leaseworker.kafka``; partitions read as
``topic[partition]`` and errors by type and message, except a timeout of our
own (``no answer in time``), which has no message worth reading.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

logger = logging.getLogger("leaseworker.kafka")


def names(tps: Iterable[Any]) -> str:
    """Return ``t[0], t[1]`` for the topic-partitions ``tps`` (sorted), or ``none``."""
    return ", ".join(sorted(f"{tp.topic}[{tp.partition}]" for tp in tps)) or "none"


def describe(exc: BaseException) -> str:
    """Return ``Type: message`` of a Kafka error, ``no answer in time`` for our timeouts.

    A ``KafkaError``'s own ``str()`` already starts with its type (and, for a
    broker's refusal, ``[Error N]``), so its message is read from its args
    instead, and the type is named once.
    """
    if isinstance(exc, TimeoutError) and not isinstance(exc, KafkaError):
        return "no answer in time"
    if isinstance(exc, KafkaError):
        return f"{type(exc).__name__}: {exc.args[0]}" if exc.args else type(exc).__name__
    return f"{type(exc).__name__}: {exc}"
