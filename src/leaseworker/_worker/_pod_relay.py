"""The pod's outbox relay: started with the pod's store, stopped after its consumer.

Every pod runs one against its completion store (any store that keeps an
outbox); its Kafka producer starts only once there is a message to send.
On stop the round in progress finishes (each send bounded), or, if the pod's
shutdown cancels it, releases its claims for the other pods' relays. Given
the pod's leases, one pod of its namespace and store at a time reports the
namespace's backlog gauges (:mod:`._backlog`).
"""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import AsyncIterator, Iterable

import anyio

from .._effects import Relay
from .._events import Hook
from .._kafka import KafkaSender
from .._lease import LeaseStore
from .._store import CompletionStore, EffectStore
from ._backlog import report_backlog, store_identity
from ._config import PodConfig


@contextlib.asynccontextmanager
async def outbox_relay(
    store: CompletionStore,
    config: PodConfig,
    hooks: Iterable[Hook] = (),
    leases: LeaseStore | None = None,
) -> AsyncIterator[Relay | None]:
    """Run ``store``'s relay while the block runs (``None``: the store keeps no outbox).

    ``hooks`` (the pod's) get the relay's ``EffectEvent`` s; the namespace's
    backlog only while this pod holds the store's reporter lease on ``leases``
    (none: never).
    """
    hooks = tuple(hooks)
    if not isinstance(store, EffectStore):
        yield None
        return
    sender = KafkaSender(
        config.bootstrap_servers,
        security=config.kafka_security,
        client_id=f"leaseworker-relay-{config.pod}",
    )
    # Unique per process: two pods of one name must not take each other's claims for their own.
    relay = Relay(
        store,
        sender,
        name=f"{config.pod}:{uuid.uuid4().hex[:8]}",
        hooks=hooks,
        hold=config.outbox_claim_timeout,
        retention=config.outbox_retention,
        backlog_every=None,  # report_backlog's, in one pod at a time
    )
    stop = anyio.Event()
    failure: Exception | None = None
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.run, stop)
            if leases is not None:
                gauges = functools.partial(
                    report_backlog,
                    relay=relay.name,
                    namespace=config.namespace,
                    store_id=store_identity(config.store_url, store),
                )
                tg.start_soon(gauges, store, leases, hooks, stop)
            try:
                yield relay
            except Exception as exc:  # the pod's own error: raised as it is, once the relay stopped
                failure = exc
            finally:
                stop.set()
    finally:
        await sender.aclose()
    if failure is not None:
        raise failure
