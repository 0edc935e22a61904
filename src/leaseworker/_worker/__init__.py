"""The pod: the composition root that wires source, executor, leases and store.

``_config`` ``WorkerConfig``; ``_worker`` the ``Worker`` and ``serve``;
``_health`` the ``/healthz``, ``/readyz`` and ``/metrics`` server;
``_looplag`` the event-loop lag monitor; ``_recorder`` the execution
recorder (``--record-history``); ``_relay`` the pod's outbox relay.
"""

from ._config import WorkerConfig as WorkerConfig
from ._health import HealthServer as HealthServer
from ._health import serve_with_health as serve_with_health
from ._recorder import HistoryRecorder as HistoryRecorder
from ._worker import Worker as Worker
from ._worker import serve as serve

__all__ = [
    "HealthServer",
    "HistoryRecorder",
    "Worker",
    "WorkerConfig",
    "serve",
    "serve_with_health",
]
