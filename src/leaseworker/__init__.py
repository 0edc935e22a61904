"""leaseworker: run long jobs safely across many worker pods.

Package layout (one subpackage per box; docs/design.md draws them), the public
API re-exported here:
``_lease``: Redis leases with a local deadline, and ``hold()``;
``_execution``: one trigger's executions under its lease (job, trigger, completion);
``_store``: the fenced, durable completion store;
``_process``: the pool of supervised child processes a job's CPU-bound work runs in;
``_kafka``: the consumer-group member, the only aiokafka importer;
``_telemetry``: spans, metrics and JSON logs;
``_worker``: the pod, wiring source, executor, leases and store;
``_timeline``: a job key's history drawn as text or a page (``leaseworker timeline``);
``_cli``: the ``leaseworker`` command, one module per subcommand;
``testing``: the kit for testing jobs (``JobEnvironment``, ``MemoryLeases``, ``ChaosProxy``);
``toolkit``: the names the tools (leaseworker-dev, in ``tools/``: local services, demos,
the fault campaign, the pytest plugin) may use, their one way into the library;
``_events``: the event family and the one ``Hook`` protocol every box reports through;
``_errors``, ``_backoff``, ``_retry``, ``_history``, ``_outcome``, ``_version``: shared
bottom modules (exceptions, backoff policies, the retry loop, the history model,
outcomes and reason codes); ``_chaos`` the fault-injecting TCP proxy
(``leaseworker.testing.ChaosProxy``), below the testing kit and the tools that use it.

The Kafka-bound names (``Pod``, ``PodConfig``, ``serve``, ``KafkaSecurity``) and the
Redis-bound ones (``RedisLeases``, ``redis_from_url``) load on first use, so ``import
leaseworker`` (and the tools' pytest plugin) loads no aiokafka, no redis-py and so no
OpenTelemetry SDK (redis-py 8.1 imports it).
``Worker``, ``WorkerConfig`` and ``BusyPolicy`` are the deprecated names of ``Pod``,
``PodConfig`` and ``Backoff`` (docs/design.md#vocabulary); they warn and are not listed.
"""

import importlib
import sys
from typing import TYPE_CHECKING, Any

from ._backoff import Backoff as Backoff
from ._deprecated import renamed as _renamed
from ._errors import BadResult as BadResult
from ._errors import ChildProcessDied as ChildProcessDied
from ._errors import ConfigError as ConfigError
from ._errors import LeaseBusy as LeaseBusy
from ._errors import LeaseError as LeaseError
from ._errors import LeaseLost as LeaseLost
from ._errors import LeaseTimeout as LeaseTimeout
from ._errors import LeaseUnavailable as LeaseUnavailable
from ._errors import LeaseworkerError as LeaseworkerError
from ._errors import MalformedTrigger as MalformedTrigger
from ._errors import StoreUnavailable as StoreUnavailable
from ._events import Attempt as Attempt
from ._events import Event as Event
from ._events import ExecutionEvent as ExecutionEvent
from ._events import Hook as Hook
from ._events import LeaseEvent as LeaseEvent
from ._events import SourceEvent as SourceEvent
from ._execution import ExecutionObserver as ExecutionObserver
from ._execution import JobContext as JobContext
from ._execution import LoggingObserver as LoggingObserver
from ._execution import ReportJob as ReportJob
from ._execution import Trigger as Trigger
from ._lease import DeadlinePolicy as DeadlinePolicy
from ._lease import HeldLease as HeldLease
from ._lease import Lease as Lease
from ._lease import LeaseInfo as LeaseInfo
from ._lease import LeaseObserver as LeaseObserver
from ._lease import LeaseStore as LeaseStore
from ._lease import LeaseTiming as LeaseTiming
from ._lease import hold as hold
from ._outcome import DeadLetterReason as DeadLetterReason
from ._outcome import LeaseLostReason as LeaseLostReason
from ._outcome import Outcome as Outcome
from ._process import ProcessContext as ProcessContext
from ._process import ProcessPool as ProcessPool
from ._store import ClaimResult as ClaimResult
from ._store import Completion as Completion
from ._store import CompletionRequest as CompletionRequest
from ._store import CompletionResult as CompletionResult
from ._store import CompletionStore as CompletionStore
from ._store import fenced_upsert as fenced_upsert
from ._store import open_store as open_store
from ._telemetry import Telemetry as Telemetry
from ._version import __version__ as __version__

if TYPE_CHECKING:
    from ._kafka import KafkaSecurity as KafkaSecurity
    from ._lease import RedisLeases as RedisLeases
    from ._lease import redis_from_url as redis_from_url
    from ._worker import Pod as Pod
    from ._worker import PodConfig as PodConfig
    from ._worker import serve as serve

_LAZY = {"KafkaSecurity": "._kafka", "Pod": "._worker", "PodConfig": "._worker"}
_LAZY["serve"] = "._worker"
_LAZY |= {"RedisLeases": "._lease", "redis_from_url": "._lease"}  # redis-py loads the OTel SDK
_RENAMED = {"Worker": "Pod", "WorkerConfig": "PodConfig", "BusyPolicy": "Backoff"}

__all__ = [
    "Attempt",
    "Backoff",
    "BadResult",
    "ChildProcessDied",
    "ClaimResult",
    "Completion",
    "CompletionRequest",
    "CompletionResult",
    "CompletionStore",
    "ConfigError",
    "DeadLetterReason",
    "DeadlinePolicy",
    "Event",
    "ExecutionEvent",
    "ExecutionObserver",
    "HeldLease",
    "Hook",
    "JobContext",
    "KafkaSecurity",
    "Lease",
    "LeaseBusy",
    "LeaseError",
    "LeaseEvent",
    "LeaseInfo",
    "LeaseLost",
    "LeaseLostReason",
    "LeaseObserver",
    "LeaseStore",
    "LeaseTimeout",
    "LeaseTiming",
    "LeaseUnavailable",
    "LeaseworkerError",
    "LoggingObserver",
    "MalformedTrigger",
    "Outcome",
    "Pod",
    "PodConfig",
    "ProcessContext",
    "ProcessPool",
    "RedisLeases",
    "ReportJob",
    "SourceEvent",
    "StoreUnavailable",
    "Telemetry",
    "Trigger",
    "__version__",
    "fenced_upsert",
    "hold",
    "open_store",
    "redis_from_url",
    "serve",
]


def _public(obj: Any) -> Any:
    if getattr(obj, "__module__", "").startswith("leaseworker."):
        obj.__module__ = "leaseworker"  # reprs and docs show the public path
    return obj


def __getattr__(name: str) -> Any:
    """Import a Kafka-bound name on first use (PEP 562), then keep it; warn on a renamed one."""
    if name in _RENAMED:
        _renamed(f"leaseworker.{name}", f"leaseworker.{_RENAMED[name]}")
        return getattr(sys.modules[__name__], _RENAMED[name])
    if name not in _LAZY:
        raise AttributeError(f"module 'leaseworker' has no attribute {name!r}")
    value = globals()[name] = _public(getattr(importlib.import_module(_LAZY[name], __name__), name))
    return value


def __dir__() -> list[str]:
    """List the public names (loaded or not), the subpackages imported so far, the private ones."""
    return sorted({*__all__, *(n for n in globals() if n.startswith("_") or n == "testing")})


for _name in __all__:
    if _name not in _LAZY:
        _public(globals()[_name])
del _name
