"""``SourceHooks``: what the Kafka source tells an observer about its records.

The source calls these at each step of a record (processing, received,
malformed, dead-lettered, committed, forgotten on revoke), as the lease layer
calls a ``LeaseObserver``; the pod's telemetry implements them (spans and
metrics), :data:`NO_HOOKS` ignores them. The Kafka layer imports no telemetry.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol, final

from .._execution import Trigger
from .._outcome import DeadLetterReason, MalformedReason


class SourceHooks(Protocol):
    """Receives the steps of every record the source handles; must not block or raise."""

    @property
    def enabled(self) -> bool:
        """Whether the hooks record anything; ``False`` lets the source skip ``processing``."""
        ...

    def processing(self, record: Any) -> AbstractContextManager[None]:
        """Enter while ``record`` is processed (the execution runs inside it)."""
        ...

    def received(self, trigger: Trigger, job_key: str) -> None:
        """Note that ``record`` decoded to ``trigger``, for ``job_key``."""
        ...

    def malformed(self, record: Any, reason: MalformedReason) -> None:
        """Note that ``record`` cannot become a job, and why (a terminal outcome)."""
        ...

    def dead_lettered(self, record: Any, reason: DeadLetterReason) -> None:
        """Note that ``record`` was copied to the dead-letter topic."""
        ...

    def committed(
        self,
        offsets: Mapping[Any, int],
        began: float,
        *,
        error: BaseException | None = None,
        rejected: bool = False,
    ) -> None:
        """Note a commit of ``offsets`` begun at ``began`` (failed: ``error``; ``rejected``)."""
        ...

    def forget(self, topic: str, partition: int) -> None:
        """Drop what is noted about a partition this pod no longer owns."""
        ...


@final
class _NoHooks:
    """Hooks that record nothing: the source's default."""

    enabled = False

    def processing(self, record: Any) -> AbstractContextManager[None]:
        """Return a context that does nothing."""
        return contextlib.nullcontext()

    def received(self, trigger: Trigger, job_key: str) -> None:
        """Ignore the step."""

    def malformed(self, record: Any, reason: MalformedReason) -> None:
        """Ignore the step."""

    def dead_lettered(self, record: Any, reason: DeadLetterReason) -> None:
        """Ignore the step."""

    def committed(
        self,
        offsets: Mapping[Any, int],
        began: float,
        *,
        error: BaseException | None = None,
        rejected: bool = False,
    ) -> None:
        """Ignore the step."""

    def forget(self, topic: str, partition: int) -> None:
        """Ignore the step."""


NO_HOOKS: SourceHooks = _NoHooks()
"""Source hooks that record nothing (the default of :class:`KafkaTriggerSource`)."""
