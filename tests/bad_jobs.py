"""Job classes with the mistakes ``leaseworker run`` must name at start (exit 2, one line)."""

from __future__ import annotations

from typing import Any, ClassVar

from leaseworker import JobContext, ReportJob


class _Base(ReportJob):
    topic = "reports"

    async def run(self, ctx: JobContext) -> object:
        return None


class SyncRun(ReportJob):
    """``def run`` instead of ``async def run``: every trigger would fail."""

    topic = "reports"

    def run(self, ctx: JobContext) -> object:  # type: ignore[override]  # the mistake under test
        """Return at once (never awaited: that is the mistake)."""
        return None


class RaisesInInit(_Base):
    """A constructor that fails (a missing setting, say)."""

    def __init__(self) -> None:
        raise RuntimeError("no database configured")


class NeedsArguments(_Base):
    """A constructor the worker cannot call: it makes the instance with no arguments."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn


class TextLease(_Base):
    """``lease_duration`` as text, as read from a config file without conversion."""

    lease_duration: ClassVar[Any] = "30"


class NegativeRuntime(_Base):
    """A ``max_runtime`` no job can meet."""

    max_runtime = -1.0


class ZeroLossBudget(_Base):
    """A loss budget that would give up before the first execution."""

    loss_budget = 0


class FloatResultBound(_Base):
    """A byte bound that is not a count."""

    max_result_bytes: ClassVar[Any] = 1.5


class SlowRenewal(_Base):
    """A renewal interval longer than the lease: the lease would expire first."""

    lease_duration = 3.0
    renewal_interval = 5.0


class BoolInterval(_Base):
    """``True`` is an int to Python, not a number of seconds to us."""

    renewal_interval: ClassVar[Any] = True


class NoTopic(_Base):
    """No topic to consume."""

    topic = ""
