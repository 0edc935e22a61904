"""The source's Kafka clients: how they are built, and started while Kafka is away.

:func:`new_consumer` and :func:`new_producer` are the default factories (one
group member with manual commits; an ``acks=all`` dead-letter producer), both
with the pod's SASL/TLS settings. :func:`start` retries a client's start-up
with capped backoff and a log line per failure until it answers or the
source stops.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # type: ignore[import-untyped]
from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

from .._backoff import Backoff
from .._retry import Retries, Sleep
from ._log_names import describe, logger
from ._quiet import quiet
from ._refusals import check_refused
from ._settings import SourceSettings

ConsumerFactory = Callable[[SourceSettings, str], Any]
"""Build the (unstarted) consumer of a topic; :func:`new_consumer` by default."""

ProducerFactory = Callable[[SourceSettings], Any]
"""Build the (unstarted) dead-letter producer; :func:`new_producer` by default."""


def new_consumer(settings: SourceSettings, topic: str) -> Any:
    """Build an aiokafka consumer of ``topic`` in the pod's group: manual commits, bounded calls.

    Its metadata refreshes back off while the brokers are away, and aiokafka's
    repeated log lines are folded (see ``_quiet``).
    """
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=settings.bootstrap_servers,
        group_id=settings.group,
        client_id=f"leaseworker-{settings.pod}",
        enable_auto_commit=False,
        auto_offset_reset=settings.auto_offset_reset,
        session_timeout_ms=_ms(settings.session_timeout),
        heartbeat_interval_ms=_ms(settings.heartbeat),
        max_poll_interval_ms=_ms(settings.max_poll_interval),
        rebalance_timeout_ms=_ms(settings.rebalance_timeout),
        request_timeout_ms=_ms(settings.kafka_timeout),
        max_poll_records=settings.concurrency,
        retry_backoff_ms=200,
        **settings.kafka_security.client_kwargs(),
    )
    quiet(consumer._client)
    return consumer


def new_producer(settings: SourceSettings) -> Any:
    """Build an aiokafka producer for dead letters: ``acks=all``, bounded calls, quiet outages."""
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap_servers,
        client_id=f"leaseworker-{settings.pod}-dead-letters",
        acks="all",
        request_timeout_ms=_ms(settings.kafka_timeout),
        **settings.kafka_security.client_kwargs(),
    )
    quiet(producer.client)
    return producer


async def start(
    what: str,
    make: Callable[[], Any],
    settings: SourceSettings,
    *,
    policy: Backoff,
    backoff: Sleep,
    before: Callable[[], Awaitable[None]] | None = None,
    waiting: Callable[[str | None], None] = lambda why: None,
) -> Any:
    """Start a client from ``make()``, retrying with capped backoff and a log line per failure.

    Each try gets a new client; a failed one is stopped. ``before()``, if
    given, runs first (the topic check), within the same bound; its Kafka
    errors are retried like the start's, anything else (a
    :class:`~leaseworker.ConfigError`) stops the client and propagates. So
    does a broker's refusal (credentials, certificates, ACLs: ``_refusals``),
    as a ConfigError: retrying cannot fix it.
    ``backoff(delay)`` waits before the next try and answers ``False`` when
    the source stops meanwhile: then this returns ``None``. ``waiting(why)``
    hears what it waits for before each retry, and ``None`` once started.
    """
    retries = Retries(policy, sleep=backoff)
    while True:
        client = make()
        try:
            if before is not None:
                await before()
            with anyio.fail_after(settings.kafka_timeout):
                await client.start()
        except (KafkaError, OSError, TimeoutError) as exc:
            await stop(client, settings)
            await check_refused(
                settings.bootstrap_servers,
                exc,
                security=settings.kafka_security,
                within=settings.kafka_timeout,
            )
            log = functools.partial(_unavailable, settings, what, exc, waiting)
            if not await retries.wait(log):
                return None
            continue
        except BaseException:
            await stop(client, settings)
            raise
        waiting(None)
        if retries.count:
            logger.info(
                "Kafka %s connected after %d attempt(s)",
                what,
                retries.count + 1,
                extra={"event": "kafka_connected", "pod": settings.pod},
            )
        return client


async def stop(client: Any, settings: SourceSettings) -> None:
    """Stop ``client`` within ``kafka_timeout``, shielded from the caller's cancellation.

    aiokafka 0.14's ``consumer.stop()`` re-raises the cancellation of a fetch
    task it cancels while that task waits out its retry backoff (a fetch that
    failed just before: a broker away, a login refused). That is no
    cancellation of ours (the scope is shielded): it is dropped, the
    timeout's own is not.
    """
    with anyio.CancelScope(shield=True), anyio.move_on_after(settings.kafka_timeout) as bound:
        try:
            await client.stop()
        except anyio.get_cancelled_exc_class():
            if bound.cancel_called:
                raise


def _unavailable(
    settings: SourceSettings,
    what: str,
    exc: BaseException,
    waiting: Callable[[str | None], None],
    delay: float,
    attempt: int,
) -> None:
    why = f"Kafka at {settings.bootstrap_servers} unavailable for the {what} ({describe(exc)})"
    waiting(f"{why}; retrying in {delay:.1f}s (attempt {attempt})")
    logger.warning(
        "%s; retrying in %.1fs (attempt %d)",
        why,
        delay,
        attempt,
        extra={"event": "kafka_unavailable", "pod": settings.pod},
    )


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))
