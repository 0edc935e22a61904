"""leaseworker: run long jobs safely across many worker pods.

Package layout: the public API is re-exported here from private modules, one
concept each. ``_lease`` holds the Redis adapter (owner tokens, fences, the
atomic scripts from ``_scripts``); ``_timing`` the local-deadline formula and
its checks; ``_hold`` the held-lease scope that cancels the body on loss;
``_errors`` the exception tree. ``_local`` starts real services as local
processes for the demo and the tests.
"""

from ._errors import ConfigError as ConfigError
from ._errors import LeaseBusy as LeaseBusy
from ._errors import LeaseError as LeaseError
from ._errors import LeaseLost as LeaseLost
from ._errors import LeaseTimeout as LeaseTimeout
from ._errors import LeaseUnavailable as LeaseUnavailable
from ._errors import LeaseworkerError as LeaseworkerError
from ._hold import HeldLease as HeldLease
from ._hold import Outcome as Outcome
from ._hold import hold as hold
from ._lease import Lease as Lease
from ._lease import LeaseInfo as LeaseInfo
from ._lease import LeaseStore as LeaseStore
from ._lease import RedisLeases as RedisLeases
from ._timing import DeadlinePolicy as DeadlinePolicy
from ._timing import LeaseTiming as LeaseTiming
from ._version import __version__ as __version__

__all__ = [
    "ConfigError",
    "DeadlinePolicy",
    "HeldLease",
    "Lease",
    "LeaseBusy",
    "LeaseError",
    "LeaseInfo",
    "LeaseLost",
    "LeaseStore",
    "LeaseTimeout",
    "LeaseTiming",
    "LeaseUnavailable",
    "LeaseworkerError",
    "Outcome",
    "RedisLeases",
    "__version__",
    "hold",
]

for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("leaseworker."):
        _obj.__module__ = "leaseworker"  # reprs and docs show the public path
del _name, _obj
