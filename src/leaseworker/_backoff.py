"""Capped, jittered exponential backoff: when to try again after "not now".

Used for busy leases (another pod holds the job), for a lease store that did
not answer, and for services that are down at start. Jitter spreads pods that
failed together so they do not retry in lock step.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from ._errors import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    """How long to wait before retrying, attempt after attempt.

    The n-th delay (n from 0) is ``min(cap, initial * multiplier**n)``, shortened
    to the ``hint`` when one is given (for a busy lease: the holder's remaining
    TTL, so a takeover happens soon after expiry), then multiplied by a random
    factor in ``[1 - jitter, 1]``. So no delay ever exceeds ``cap``::

        class NightlyReport(ReportJob):
            busy_backoff = Backoff(initial=0.5, cap=10)
    """

    initial: float = 0.25
    cap: float = 5.0
    multiplier: float = 2.0
    jitter: float = 0.5
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.initial <= 0:
            raise ConfigError(f"initial backoff must be > 0 seconds, got {self.initial}")
        if self.cap < self.initial:
            raise ConfigError(f"backoff cap={self.cap}s must be >= initial={self.initial}s")
        if self.multiplier < 1:
            raise ConfigError(f"backoff multiplier must be >= 1, got {self.multiplier}")
        if not 0 <= self.jitter < 1:
            raise ConfigError(f"backoff jitter must be in [0, 1), got {self.jitter}")

    def delay(self, attempt: int, hint: float | None = None) -> float:
        """Seconds to wait before retry number ``attempt`` (0 for the first retry)."""
        base = min(self.cap, self.initial * self.multiplier ** min(attempt, 64))
        if hint is not None and hint >= 0:
            base = min(base, max(hint, self.initial / 4))
        return base * (1 - self.jitter * self.rng.random())
