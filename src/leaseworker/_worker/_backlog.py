"""The outbox backlog gauges: one namespace's unsent messages, reported by one of its pods.

The backlog is the completion store's, seen alike from every pod on it: were
every pod to report it, a dashboard's sum would count it once per pod. Pods
of several namespaces may share one store (their relays send every
namespace's rows), and during a move one namespace's pods may be on two
stores. So a series is one (namespace, store): it counts only the
namespace's rows (job keys ``{namespace}:{...}``) and is labelled
``leaseworker.namespace``, and the namespace's pods on one store elect its
reporter with the framework's own lease on :func:`reporter_key`, which names
the store (:func:`store_identity`), in the namespace's Redis (the one its
leases already share). Summed over series, each unsent message counts once.

The holder samples the store every :data:`EVERY` seconds and tells the
hooks; the others sample nothing, report nothing and try to take the lease
at the same pace. A reporter that stops releases it; one that dies or loses
Redis leaves it to expire (``lease_duration``, at most
:func:`reporter_lease` seconds), then another pod takes over. Losing the
lease clears this pod's gauges (``EffectEvent(name="backlog", depth=None)``),
so exactly one series goes on. Its own task: nothing on the trigger path.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
from collections.abc import Sequence

import anyio

from .._errors import LeaseBusy, LeaseError, StoreUnavailable
from .._events import EffectEvent, Hook, emit, hooks_for
from .._execution import completion_key
from .._lease import LeaseStore, hold
from .._store import EffectStore, parse_store_url

logger = logging.getLogger("leaseworker.relay")

REPORTER_KEY = "leaseworker.outbox-gauges"
"""The reporter's lease key begins so: ``{namespace}:{leaseworker.outbox-gauges:<store>}:lease``."""

EVERY = 5.0
"""Seconds between two samples of the reporter, and between two tries of the others."""


def reporter_lease(leases: LeaseStore) -> float:
    """Return the reporter's lease duration: 15 s, longer when Redis calls may take long."""
    return max(15.0, 6 * leases.policy.command_timeout)


def store_identity(store_url: str, store: object) -> str:
    """Return a short digest naming the database behind ``store_url`` (no credential in it).

    PostgreSQL: its hosts, port and database name (pods must spell them alike);
    SQLite: this host and the file's real path; ``memory://``: this process's ``store``.
    """
    parsed = parse_store_url(store_url)
    if parsed.backend == "postgresql":
        from psycopg.conninfo import conninfo_to_dict  # the PostgreSQL extra: only for that store

        params = conninfo_to_dict(parsed.target)
        named = [str(params.get(k) or "") for k in ("host", "hostaddr", "port", "dbname")]
    elif parsed.backend == "sqlite":
        named = [socket.gethostname(), os.path.realpath(parsed.target)]
    else:
        named = [socket.gethostname(), str(os.getpid()), str(id(store))]
    text = "\x00".join([parsed.backend, *named])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def reporter_key(store_id: str) -> str:
    """Return the job key of the reporter's lease for the store :func:`store_identity` named."""
    return f"{REPORTER_KEY}:{store_id}"


async def report_backlog(
    store: EffectStore,
    leases: LeaseStore,
    hooks: Sequence[Hook],
    stop: anyio.Event,
    *,
    relay: str,
    namespace: str,
    store_id: str,
    every: float = EVERY,
) -> None:
    """Report ``namespace``'s backlog while this pod holds the store's reporter lease."""
    hooks = hooks_for(hooks, EffectEvent)
    if not hooks:
        return
    prefix = completion_key(namespace, "").removesuffix("}")  # ``{namespace}:{``
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_cancel_when_set, stop, scope)
            while True:
                try:
                    lease = reporter_lease(leases)
                    async with hold(leases, reporter_key(store_id), lease_duration=lease):
                        logger.debug("reporting the outbox backlog", extra={"event": "gauges"})
                        while True:
                            await _sample(store, hooks, relay, namespace, prefix)
                            await anyio.sleep(every)
                except LeaseBusy:
                    pass  # another pod reports
                except LeaseError as exc:  # lost or Redis away: another pod may take over
                    logger.debug("outbox gauges: %s", type(exc).__name__, extra={"event": "gauges"})
                finally:  # depth None: cleared
                    emit(hooks, EffectEvent(name="backlog", relay=relay, namespace=namespace))
                await anyio.sleep(every)


async def _sample(
    store: EffectStore, hooks: Sequence[Hook], relay: str, namespace: str, prefix: str
) -> None:
    """Tell ``hooks`` the namespace's backlog (a store away: nothing said this time)."""
    try:
        depth, oldest_age = await store.outbox_backlog(prefix)
    except StoreUnavailable:
        return
    event = EffectEvent(
        name="backlog", depth=depth, oldest_age=oldest_age, relay=relay, namespace=namespace
    )
    emit(hooks, event)


async def _cancel_when_set(stop: anyio.Event, scope: anyio.CancelScope) -> None:
    await stop.wait()
    scope.cancel()
