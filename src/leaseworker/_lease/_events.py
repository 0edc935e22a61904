"""What happens to a held lease, as events an observer can turn into spans or metrics.

``hold()`` reports each step of a lease's life to an optional
:class:`LeaseObserver`: acquired, every renewal (with its round trip and the
validity it bought), the loss and the cancel it requested, how long the body
took to stop, and the release. Observers run inline and must be quick; an
observer that raises is logged and ignored, never allowed to change the outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from .._outcome import LeaseLostReason

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
    :class:`LeaseObserver`). ``expires_at`` (acquired, renewed): the earliest
    moment Redis can expire the key, on the same clock as ``at`` (the
    request's send time plus the TTL).
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


class LeaseObserver(Protocol):
    """Receives every :class:`LeaseEvent` of one held lease; must not block.

    An observer may also define ``lease_note() -> str``: ``hold()`` stores what
    it returns with the acquisition (telemetry: its trace reference), and the
    next acquisition of the key gets it back as ``LeaseEvent.previous``.
    """

    def on_lease_event(self, event: LeaseEvent) -> None:
        """Handle one lease event."""
        ...
