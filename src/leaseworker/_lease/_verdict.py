"""The verdict on a renewal's answer: one judgement for every lease store.

``RedisLeases`` and ``leaseworker.testing.MemoryLeases`` get different answers
(a Lua script's reply, a dict lookup) but must judge them alike, or the
testing kit would test another product: a refused renewal is ``rejected``, one
too few replicas acknowledged is ``unreplicated``, and a success that arrives
after the local deadline is ``late`` (it must not revive ownership that
already lapsed locally). Only a timely, replicated success buys a new
deadline, measured from when the renewal was sent.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from .._errors import LeaseLost
from .._outcome import LeaseLostReason
from ._timing import DeadlinePolicy, now

if TYPE_CHECKING:  # _leases calls this module: no import cycle at run time
    from ._model import Lease


def judge_renewal(
    lease: Lease,
    *,
    sent_at: float,
    policy: DeadlinePolicy,
    extended: bool,
    unreplicated: str | None = None,
) -> Lease:
    """Return ``lease`` renewed from ``sent_at``, or raise :class:`LeaseLost` saying why not.

    ``extended``: whether the store extended this owner's key; ``unreplicated``:
    why the extension does not count (too few replicas have it), ``None`` when it does.
    """
    if not extended:
        raise lease_lost(lease, "rejected", "the lease key is gone or has another owner")
    if unreplicated is not None:
        raise lease_lost(lease, "unreplicated", unreplicated)
    late_by = now() - lease.local_deadline
    if late_by > 0:
        raise lease_lost(
            lease, "late", f"answer arrived {late_by * 1000:.1f} ms after the deadline"
        )
    return replace(
        lease, sent_at=sent_at, local_deadline=policy.local_deadline(sent_at, lease.lease_duration)
    )


def lease_lost(lease: Lease, reason: LeaseLostReason, detail: str) -> LeaseLost:
    """Return the :class:`LeaseLost` of ``lease``, for ``reason``."""
    return LeaseLost(lease.key, fence=lease.fence, reason=reason, detail=detail)
