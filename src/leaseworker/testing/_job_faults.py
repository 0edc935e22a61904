"""Faults a :class:`~leaseworker.testing.JobEnvironment` injects into one execution, on demand.

Each is a frozen value naming *when* (a checkpoint, a renewal, a lease time,
the completion) and *what* goes wrong, in the words of the design notes. They
apply to the first execution of a run; lease times count from its acquire.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._outcome import LeaseLostReason
from ._faulty_store import StoreCall
from ._memory_leases import RenewalFault


@dataclass(frozen=True, slots=True)
class LoseAtCheckpoint:
    """The ``n``-th ``checkpoint()`` (from 1) finds ownership uncertain, for ``reason``.

    As if a renewal had just failed: the checkpoint raises
    :class:`~leaseworker.LeaseLost`. With ``rejected`` (the default) the key
    is gone from the lease store too, so the release deletes nothing.
    """

    n: int
    reason: LeaseLostReason = "rejected"


@dataclass(frozen=True, slots=True)
class FailRenewal:
    """The ``n``-th renewal (from 1) fails ``how``: rejected, timeout, late or error.

    ``timeout`` takes the store's ``command_timeout``; ``late`` is an answer
    processed after the local deadline (the loop was blocked). The job stops
    at its next await after the failure.
    """

    how: RenewalFault = "rejected"
    n: int = 1


@dataclass(frozen=True, slots=True)
class KeyTaken:
    """``after`` seconds into the lease, another pod takes the key (expiry, eviction, a flush).

    This pod learns of it at its next renewal, which is rejected.
    """

    after: float


@dataclass(frozen=True, slots=True)
class Stall:
    """At the ``n``-th ``checkpoint()`` the event loop blocks for ``seconds``.

    CPU-bound work or a GC pause: nothing runs meanwhile, renewals included.
    """

    n: int
    seconds: float


@dataclass(frozen=True, slots=True)
class Superseded:
    """When this execution completes, another pod has taken over the job key with a higher fence.

    As after a pause past the lease: the other pod acquired and claimed the
    job key, so ``complete()`` answers ``stale`` (outcome ``lost``, reason
    ``stale``). With ``completed=True`` it also completed the same identity
    already, and the answer is ``duplicate``.
    """

    completed: bool = False


@dataclass(frozen=True, slots=True)
class StoreOutage:
    """The next ``calls`` store calls of kind ``during`` raise ``StoreUnavailable``.

    ``complete``: the completion is retried with backoff while the lease holds;
    ``lookup`` or ``claim``: the execution ends ``lost`` (``store_unavailable``)
    and the trigger is retried.
    """

    calls: int = 1
    during: StoreCall = "complete"


Fault = LoseAtCheckpoint | FailRenewal | KeyTaken | Stall | Superseded | StoreOutage
"""Any fault a :class:`~leaseworker.testing.JobEnvironment` run accepts."""
