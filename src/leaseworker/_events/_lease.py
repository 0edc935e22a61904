"""What happens to a held lease: one :class:`LeaseEvent` per step, for the hooks.

``hold()`` reports each step of a lease's life to its hooks: acquired, every
renewal (with its round trip and the validity it bought), the loss and the
cancel it requested, how long the body took to stop, and the release.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .._outcome import LeaseLostReason
from ._identity import Attempt

LeaseEventName = Literal[
    "acquired", "renewed", "lost", "cancel_requested", "stopped", "released", "release_failed"
]


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseEvent:
    """One step of a held lease; fields that do not apply are ``None``.

    ``round_trip``: seconds the Redis call took (acquire, renew, release).
    ``remaining``: seconds of trusted ownership left after the step.
    On ``lost`` after a failed renewal, ``round_trip`` is the time from sending
    that renewal to its verdict.
    ``reason``/``detail``: why ownership was lost. ``stop_latency``: seconds from
    the loss until the body stopped. ``deleted``: whether the release deleted
    this owner's key. ``error``: why the release failed. ``previous``: on
    ``acquired``, the note the acquisition before this one left (see
    ``lease_note`` of :func:`~leaseworker.hold`). ``expires_at`` (acquired,
    renewed): the earliest moment Redis can expire the key, on the same clock
    as ``at`` (the request's send time plus the TTL). ``attempt``: the
    execution holding the lease (``None`` for a bare ``hold()``).
    """

    name: LeaseEventName
    key: str
    fence: int
    at: float
    round_trip: float | None = None
    remaining: float | None = None
    reason: LeaseLostReason | None = None
    detail: str | None = None
    stop_latency: float | None = None
    deleted: bool | None = None
    error: BaseException | None = None
    previous: str | None = None
    expires_at: float | None = None
    attempt: Attempt | None = None
