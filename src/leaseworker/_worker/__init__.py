"""The pod: the composition root that wires source, executor, leases and store.

``_config`` ``PodConfig``; ``_worker`` the ``Pod`` and ``serve``; ``_way``
the trigger's way, from the Kafka source's poll to the offset commit;
``_health`` the ``/healthz``, ``/readyz`` and ``/metrics`` server;
``_looplag`` the event-loop lag monitor; ``_recorder`` the execution
recorder (``--record-history``); ``_pod_relay`` the pod's outbox relay.
"""

from ._config import PodConfig as PodConfig
from ._health import HEALTH_PATH as HEALTH_PATH
from ._health import READY_PATH as READY_PATH
from ._health import HealthServer as HealthServer
from ._health import serve_with_health as serve_with_health
from ._recorder import HistoryRecorder as HistoryRecorder
from ._way import Executions as Executions
from ._way import TriggerWay as TriggerWay
from ._worker import Pod as Pod
from ._worker import serve as serve

__all__ = [
    "HEALTH_PATH",
    "READY_PATH",
    "Executions",
    "HealthServer",
    "HistoryRecorder",
    "Pod",
    "PodConfig",
    "TriggerWay",
    "serve",
    "serve_with_health",
]
