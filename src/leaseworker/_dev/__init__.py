"""Development services and demos: not the library, imported only by the CLI and tests.

``_services`` starts real Redis (one node, Sentinel, Cluster), Kafka, PostgreSQL
and Jaeger as local processes; ``_incident`` the one-process incident demo;
``_failover`` the Sentinel failover demo; ``_stack`` the local
stack demo (and the stack alone, ``services_demo``), with ``_pods`` (its pod
processes) and ``_marks`` (their execution marks); ``_jaeger_links`` links into the local Jaeger.
"""

from ._failover import failover_demo as failover_demo
from ._incident import incident_demo as incident_demo
from ._stack import services_demo as services_demo
from ._stack import stack_demo as stack_demo

__all__ = [
    "failover_demo",
    "incident_demo",
    "services_demo",
    "stack_demo",
]
