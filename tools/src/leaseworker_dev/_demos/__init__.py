"""The demos of ``leaseworker demo``, on the local services of ``_services``.

``_incident`` the one-process incident demo; ``_failover`` the Sentinel
failover demo; ``_stack_demo`` the local stack demo (and the stack alone,
``services_demo``), with ``_notifications`` its effect receiver and
``_jaeger_links`` its links into the local Jaeger.
"""

from ._failover import failover_demo as failover_demo
from ._incident import incident_demo as incident_demo
from ._jaeger_links import pod_environment as pod_environment
from ._stack_demo import DEFAULT_HTML as DEFAULT_HTML
from ._stack_demo import EXAMPLE as EXAMPLE
from ._stack_demo import services_demo as services_demo
from ._stack_demo import stack_demo as stack_demo

__all__ = [
    "DEFAULT_HTML",
    "EXAMPLE",
    "failover_demo",
    "incident_demo",
    "pod_environment",
    "services_demo",
    "stack_demo",
]
