"""``KafkaSender``: the outbox relay's idempotent producer (``acks=all``).

The relay (``leaseworker._effects``) hands it one outbox row at a time and
waits for the broker's acknowledgement before marking the row sent; the
producer is started on first use and kept, reconnecting by itself while a
broker restarts. Every send is bounded by ``timeout``. After a running
client's SASL login was refused (``_logins``) and the password file holds a
new password, the producer is stopped and built again with it; with the same
password it is kept (the pod's source decides on exit 2).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, final

import anyio
from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]

from .._store._effects import OutboxRow
from ._logins import Login
from ._quiet import quiet
from ._security import KafkaSecurity

SEND_TIMEOUT = 10.0
"""Seconds the sender may take to start its producer, and again for one wave of sends."""


@final
class KafkaSender:
    """Send outbox rows with the idempotent producer; see the module docstring."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        security: KafkaSecurity | None = None,
        client_id: str = "leaseworker-relay",
        timeout: float = SEND_TIMEOUT,
    ) -> None:
        self._bootstrap = bootstrap_servers
        self._security = security or KafkaSecurity()
        self._client_id = client_id
        self._timeout = timeout
        self._producer: Any = None
        self._starting = anyio.Lock()
        self._start_failed: tuple[float, BaseException] | None = None  # (when, why)
        self._login = Login(self._security)

    async def send(self, row: OutboxRow) -> tuple[int, int]:
        """Send ``row`` and return (partition, offset) once every in-sync replica has it."""
        (outcome,) = await self.send_batch([row])
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def send_batch(self, rows: Sequence[OutboxRow]) -> list[tuple[int, int] | Exception]:
        """Send ``rows`` together (the producer batches them); wait for every answer.

        Each answer is (partition, offset) once every in-sync replica has the
        row, or why not; the whole wave is bounded by ``timeout``.
        """
        try:
            producer = await self._started()
        except Exception as exc:  # the brokers are down: every row fails alike
            return [exc] * len(rows)
        outcomes: list[tuple[int, int] | Exception] = []
        with anyio.move_on_after(self._timeout):
            deliveries = []
            for row in rows:  # no await that yields in here: the rows go in as one batch
                message = row.message
                try:
                    deliveries.append(
                        await producer.send(
                            message.topic,
                            value=message.value,
                            key=message.key,
                            headers=row.kafka_headers(),
                        )
                    )
                except Exception as exc:  # e.g. a value too large for the topic
                    deliveries.append(_failed(exc))
            for delivery in deliveries:
                try:
                    meta = await delivery
                except Exception as exc:
                    outcomes.append(exc)
                else:
                    outcomes.append((int(meta.partition), int(meta.offset)))
        timeout = TimeoutError(f"no acknowledgement within {self._timeout}s")
        outcomes += [timeout] * (len(rows) - len(outcomes))
        if any(isinstance(outcome, Exception) for outcome in outcomes):
            await self._discard(producer)
        return outcomes

    async def _discard(self, producer: Any) -> None:
        """Drop ``producer`` after a failed send: the next send starts a new one.

        An idempotent producer whose batch failed (a record the broker refused,
        a send that timed out) has spent that sequence number: aiokafka answers
        every later send OutOfOrderSequenceNumber, so the relay would never
        deliver again. A new producer gets a new producer id.
        """
        async with self._starting:
            if self._producer is not producer:
                return  # another wave's failure dropped it already
            self._producer = None
        with anyio.CancelScope(shield=True), anyio.move_on_after(self._timeout):
            await producer.stop()

    async def aclose(self) -> None:
        """Stop the producer (flushing what it holds, within ``timeout``)."""
        producer, self._producer = self._producer, None
        if producer is not None:
            with anyio.CancelScope(shield=True), anyio.move_on_after(self._timeout):
                await producer.stop()

    async def _started(self) -> Any:
        """Return the started producer; start it first (a start that just failed is not retried).

        Once started, no lock is taken: acquiring one yields to the event
        loop, and the producer would then send a wave in many small requests.

        The relay's chains all wait here while the brokers are down: the first
        one's failure answers the others at once, for ``timeout`` seconds, so a
        round of many keys fails in one ``timeout``, not one per key.
        """
        if self._producer is not None and not self._login.refused():  # one comparison, no yield
            return self._producer
        async with self._starting:
            failed = self._start_failed
            if failed is not None and anyio.current_time() - failed[0] < self._timeout:
                raise failed[1]
            if self._producer is not None and self._login.refused():
                if self._login.rotated():
                    await self.aclose()  # built again below, with the new password
                self._login.seen()
            if self._producer is None:
                self._login.built()
                producer = AIOKafkaProducer(
                    bootstrap_servers=self._bootstrap,
                    acks="all",
                    enable_idempotence=True,
                    request_timeout_ms=max(1, int(self._timeout * 1000)),
                    client_id=self._client_id,
                    **self._security.client_kwargs(),
                )
                quiet(producer.client)
                try:
                    with anyio.fail_after(self._timeout):
                        await producer.start()
                except BaseException as exc:
                    self._start_failed = (anyio.current_time(), exc)
                    with anyio.CancelScope(shield=True), anyio.move_on_after(self._timeout):
                        await producer.stop()
                    raise
                self._producer, self._start_failed = producer, None
            return self._producer


def _failed(exc: Exception) -> asyncio.Future[Any]:
    """Return a future holding ``exc``: a row the producer refused before sending."""
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_exception(exc)
    return future
