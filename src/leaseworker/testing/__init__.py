"""Test helpers shipped with leaseworker, for its own tests and for yours (docs/testing.md).

``_environment`` ``JobEnvironment``, which runs a job on one trigger through
the pod's executor in memory; ``_one_run`` one such run (its hook and faults);
``_job_result`` ``JobResult``, how a trigger ended; ``_job_faults`` the faults it
injects on demand; ``_faulty_store`` ``FaultyStore``, a completion store with
outages; ``_committed`` the statements and messages a run committed;
``_memory_leases`` ``MemoryLeases``, the in-memory lease store with Redis's
rules (the lease conformance suite runs on both); ``_clock``
``VirtualTimeLoop``, asyncio on virtual time; ``_triggers`` triggers built by
the pod's decoder; ``ChaosProxy`` (from ``leaseworker._chaos``, below the tools'
services that use it too) sits between a client and a real server and can
black-hole, delay or cut the traffic. The pytest plugin (fixtures for real
services) is leaseworker-dev's, ``leaseworker_dev.pytest_plugin``.
"""

from .._chaos import ChaosProxy as ChaosProxy
from .._history import Step as Step
from ._clock import VirtualTimeLoop as VirtualTimeLoop
from ._clock import run_in_virtual_time as run_in_virtual_time
from ._clock import stall as stall
from ._environment import JobEnvironment as JobEnvironment
from ._faulty_store import FaultyStore as FaultyStore
from ._job_faults import FailRenewal as FailRenewal
from ._job_faults import Fault as Fault
from ._job_faults import KeyTaken as KeyTaken
from ._job_faults import LoseAtCheckpoint as LoseAtCheckpoint
from ._job_faults import Stall as Stall
from ._job_faults import StoreOutage as StoreOutage
from ._job_faults import Superseded as Superseded
from ._job_result import JobResult as JobResult
from ._job_result import ended as _ended  # noqa: F401 (leaseworker.toolkit's, for the embedded pod)
from ._job_result import execution_step as _execution_step  # noqa: F401 (the same)
from ._memory_leases import MemoryLeases as MemoryLeases
from ._memory_leases import RenewalFault as RenewalFault
from ._triggers import DEAD_LETTER_SUFFIX as _DEAD_LETTER_SUFFIX  # noqa: F401 (the same)
from ._triggers import decode_record as decode_record
from ._triggers import make_trigger as make_trigger

__all__ = [
    "ChaosProxy",
    "FailRenewal",
    "Fault",
    "FaultyStore",
    "JobEnvironment",
    "JobResult",
    "KeyTaken",
    "LoseAtCheckpoint",
    "MemoryLeases",
    "RenewalFault",
    "Stall",
    "Step",
    "StoreOutage",
    "Superseded",
    "VirtualTimeLoop",
    "decode_record",
    "make_trigger",
    "run_in_virtual_time",
    "stall",
]

for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith(
        ("leaseworker.testing._", "leaseworker._chaos", "leaseworker._history")
    ):
        _obj.__module__ = "leaseworker.testing"  # reprs and docs show the public path
del _name, _obj
