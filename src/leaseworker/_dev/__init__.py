"""Development services and demos: not the library, imported by the tooling only.

Its users: the CLI's ``demo``, the fault campaign, the pytest plugin's fixtures
(lazily), leaseworker's own tests and benches. ``_services`` starts real Redis
(one node, Sentinel, Cluster), Kafka, PostgreSQL and Jaeger as local
processes, and ``_services._stack`` is the one stack builder over them;
``_pods`` the one pod process (``leaseworker run`` with ``/readyz`` and a
recorded history); ``_incident`` the one-process incident demo; ``_failover``
the Sentinel failover demo; ``_stack`` the local stack demo (and the stack
alone, ``services_demo``); ``_jaeger_links`` links into the local Jaeger.
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
