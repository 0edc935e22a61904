"""The outbox backlog gauges, reported by one pod of a namespace at a time.

The backlog (unsent messages, the oldest one's age) is the store's, the same
seen from every pod: were every pod to report it, a dashboard's sum would
count it once per pod. So the pods elect one reporter with the framework's
own lease on a well-known key (:data:`REPORTER_KEY`, in the pod's lease
namespace): the holder samples the store every :data:`EVERY` seconds and
tells the hooks; the others sample nothing, report nothing and try to take
the lease at the same pace. A reporter that stops releases it; one that dies
or loses Redis leaves it to expire (``lease_duration``, at most
:func:`reporter_lease` seconds), then another pod takes over. Losing the
lease clears this pod's gauges (``EffectEvent(name="backlog", depth=None)``),
so exactly one series goes on. Its own task: nothing on the trigger path.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import anyio

from .._errors import LeaseBusy, LeaseError, StoreUnavailable
from .._events import EffectEvent, Hook, emit, hooks_for
from .._lease import LeaseStore, hold
from .._store._effects import EffectStore

logger = logging.getLogger("leaseworker.relay")

REPORTER_KEY = "leaseworker.outbox-gauges"
"""The job key of the reporter's lease (``{namespace}:{leaseworker.outbox-gauges}:lease``)."""

EVERY = 5.0
"""Seconds between two samples of the reporter, and between two tries of the others."""


def reporter_lease(leases: LeaseStore) -> float:
    """Return the reporter's lease duration: 15 s, longer when Redis calls may take long."""
    return max(15.0, 6 * leases.policy.command_timeout)


async def report_backlog(
    store: EffectStore,
    leases: LeaseStore,
    hooks: Sequence[Hook],
    stop: anyio.Event,
    *,
    relay: str,
    every: float = EVERY,
) -> None:
    """Report the backlog while this pod holds the reporter's lease, until ``stop`` is set."""
    hooks = hooks_for(hooks, EffectEvent)
    if not hooks:
        return
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_cancel_when_set, stop, scope)
            while True:
                try:
                    async with hold(leases, REPORTER_KEY, lease_duration=reporter_lease(leases)):
                        logger.debug("reporting the outbox backlog", extra={"event": "gauges"})
                        while True:
                            await _sample(store, hooks, relay)
                            await anyio.sleep(every)
                except LeaseBusy:
                    pass  # another pod reports
                except LeaseError as exc:  # lost or Redis away: another pod may take over
                    logger.debug("outbox gauges: %s", type(exc).__name__, extra={"event": "gauges"})
                finally:
                    emit(hooks, EffectEvent(name="backlog", relay=relay))  # depth None: cleared
                await anyio.sleep(every)


async def _sample(store: EffectStore, hooks: Sequence[Hook], relay: str) -> None:
    """Tell ``hooks`` the store's backlog (a store away: nothing said this time)."""
    try:
        depth, oldest_age = await store.outbox_backlog()
    except StoreUnavailable:
        return
    emit(hooks, EffectEvent(name="backlog", depth=depth, oldest_age=oldest_age, relay=relay))


async def _cancel_when_set(stop: anyio.Event, scope: anyio.CancelScope) -> None:
    await stop.wait()
    scope.cancel()
