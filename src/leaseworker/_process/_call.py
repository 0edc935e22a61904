"""What a call carries into its child, what it reports back, and the caller's ``Mirror``.

``Identity`` goes in, ``Usage`` comes back, and lease news is pushed through the
``Mirror`` while the call runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .._outcome import LeaseLostReason


@dataclass(frozen=True, slots=True)
class Identity:
    """The execution a call belongs to, as the child's ``ProcessContext`` shows it."""

    job_key: str
    execution_id: str
    fence: int


@dataclass(frozen=True, slots=True)
class Usage:
    """What one call cost in its child: CPU (user+sys, child and its waited children) and peak RSS.

    ``peak_memory`` is the call's own peak in bytes (VmHWM reset before the
    call; its result's pickle is the call's too); for a killed child it is the
    child's lifetime peak (wait4's ``ru_maxrss``), an upper bound. ``killed``:
    the pod killed the child's group (the call was cancelled: lease lost,
    deadline, shutdown).
    """

    cpu_seconds: float
    peak_memory: int
    pid: int
    killed: bool


class Mirror(Protocol):
    """Lease news for a running call, pushed by the caller into the child's shared slot."""

    def move(self, deadline: float) -> None:
        """Set a new deadline, on ``time.monotonic()``'s clock (a renewal confirmed)."""

    def lose(self, reason: LeaseLostReason) -> None:
        """Mark ownership uncertain for good; the child's ``checkpoint()`` raises from now on."""
