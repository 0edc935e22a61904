"""The lease: Redis ownership with a local deadline that stops the work in time.

``_redis_clients`` one Redis URL for every topology, and its client; ``_routing``
sends each call of a Redis Cluster to its slot's node; ``_model`` the
``Lease`` value and the ``LeaseStore`` protocol; ``_redis_leases`` ``RedisLeases``;
``_scripts`` the owner-checked Lua scripts; ``_verdict`` the verdict on a
renewal's answer (shared with ``MemoryLeases``); ``_renewals`` the held leases'
clock (one shared renewal tick per loop); ``_releases`` batches the releases of
blocks ending together; ``_pipelining`` groups concurrent
calls into one round trip, which ``_trips`` makes; ``_deadlines`` bounds each call; ``_timing`` the
local-deadline formula and its checks; ``_hold`` the held-lease scope that
cancels its body on loss (its events are ``leaseworker._events.LeaseEvent``).
Imports nothing of leaseworker above ``_errors`` (an import contract checks it).
The names that need redis-py (``_REDIS_BOUND``) load on first use: redis-py 8.1
imports the OpenTelemetry SDK (``redis.observability.providers``, via
``redis.maint_notifications``), which ``import leaseworker`` must not.
"""

import importlib
from typing import TYPE_CHECKING, Any

from .._events import LeaseEvent as LeaseEvent
from .._outcome import Outcome as Outcome
from ._hold import HeldLease as HeldLease
from ._hold import LeaseObserver as LeaseObserver
from ._hold import hold as hold
from ._model import Lease as Lease
from ._model import LeaseInfo as LeaseInfo
from ._model import LeaseStore as LeaseStore
from ._model import check_lease_duration as check_lease_duration
from ._model import checked_key as checked_key
from ._model import describe_failure as describe_failure
from ._model import duration_from_ttl as duration_from_ttl
from ._model import ttl_ms as ttl_ms
from ._scripts import RELEASE as RELEASE
from ._timing import DeadlinePolicy as DeadlinePolicy
from ._timing import LeaseTiming as LeaseTiming
from ._timing import now as now
from ._verdict import judge_renewal as judge_renewal
from ._verdict import lease_lost as lease_lost

if TYPE_CHECKING:
    from ._probe import check_redis as check_redis
    from ._probe import ping_redis as ping_redis
    from ._probe import redis_refusal as redis_refusal
    from ._probe import start_refusal as start_refusal
    from ._redis_clients import RedisTarget as RedisTarget
    from ._redis_clients import parse_redis_url as parse_redis_url
    from ._redis_clients import redis_from_url as redis_from_url
    from ._redis_clients import with_tls_files as with_tls_files
    from ._redis_leases import RedisLeases as RedisLeases

_REDIS_BOUND = {
    "RedisTarget": "._redis_clients",
    "parse_redis_url": "._redis_clients",
    "redis_from_url": "._redis_clients",
    "with_tls_files": "._redis_clients",
    "RedisLeases": "._redis_leases",
    "check_redis": "._probe",
    "ping_redis": "._probe",
    "redis_refusal": "._probe",
    "start_refusal": "._probe",
}

__all__ = [
    "RELEASE",
    "DeadlinePolicy",
    "HeldLease",
    "Lease",
    "LeaseEvent",
    "LeaseInfo",
    "LeaseObserver",
    "LeaseStore",
    "LeaseTiming",
    "Outcome",
    "RedisLeases",
    "RedisTarget",
    "check_lease_duration",
    "check_redis",
    "checked_key",
    "describe_failure",
    "duration_from_ttl",
    "hold",
    "judge_renewal",
    "lease_lost",
    "now",
    "parse_redis_url",
    "ping_redis",
    "redis_from_url",
    "redis_refusal",
    "start_refusal",
    "ttl_ms",
    "with_tls_files",
]


def __getattr__(name: str) -> Any:
    """Import a redis-bound name on first use (PEP 562), then keep it."""
    if name not in _REDIS_BOUND:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(_REDIS_BOUND[name], __name__), name)
    return value
