"""``ProcessContext``: what a job's function sees of its lease, inside the child process."""

from __future__ import annotations

import mmap
import time
from typing import Final, final

from .._errors import LeaseLost
from ._slot import REASONS, read

_DETAIL: Final = "seen by the job's child process"


@final
class ProcessContext:
    """The first argument of a function run by ``ProcessPool.run`` (``ctx.run_in_process``).

    ``owned``, ``remaining()`` and ``checkpoint()`` read the deadline and the loss
    flag the pod keeps in shared memory (no round trip: well under a microsecond,
    ``bench/process_checkpoint.py``). The child is killed at the deadline whether or
    not the function checks; checking lets it stop cleanly, earlier.
    """

    __slots__ = ("_slot", "execution_id", "fence", "job_key")

    def __init__(self, slot: mmap.mmap, *, job_key: str, execution_id: str, fence: int) -> None:
        self._slot = slot
        self.job_key = job_key
        self.execution_id = execution_id
        self.fence = fence

    @property
    def owned(self) -> bool:
        """Whether the lease is still this execution's: not lost and before the deadline."""
        deadline, code, _ = read(self._slot)
        return not code and time.monotonic() < deadline

    def remaining(self) -> float:
        """Seconds left to the deadline, 0 once not owned."""
        deadline, code, _ = read(self._slot)
        return 0.0 if code else max(0.0, deadline - time.monotonic())

    def checkpoint(self) -> None:
        """Raise ``LeaseLost`` once the lease is not owned; return at once otherwise."""
        deadline, code, lost_at = read(self._slot)
        now = time.monotonic()
        if not code and now < deadline:
            return
        reason = REASONS[code - 1] if code else "deadline"
        since = lost_at if code else deadline
        raise LeaseLost(
            self.job_key,
            fence=self.fence,
            reason=reason,
            detail=_DETAIL,
            stop_latency=max(0.0, now - since),
        )

    def __repr__(self) -> str:
        return f"ProcessContext(job_key={self.job_key!r}, fence={self.fence})"
