"""Job classes checked when a pod is built, so a mistake is one line at start, not a trigger's.

``run`` must be a coroutine function (a plain ``def`` would fail every
trigger), and each class attribute must have its type and range: a string
``lease_duration`` or a ``loss_budget`` of 0 is a :class:`ConfigError` naming
the attribute. The lease timing's own rules (a renewal that beats the
deadline) are checked by :meth:`ReportJob.lease_timing`.
"""

from __future__ import annotations

import inspect
import math

from .._errors import ConfigError
from ._job import ReportJob, check_topic_and_busy_backoff


def check_job_class(cls: type[ReportJob]) -> None:
    """Raise :class:`ConfigError` (one line, naming the class) unless ``cls`` can run."""
    name = cls.__qualname__
    if not inspect.iscoroutinefunction(cls.run):
        raise ConfigError(f"{name}.run must be a coroutine function: declare it `async def run`")
    check_topic_and_busy_backoff(cls)
    _seconds(name, "lease_duration", cls.lease_duration, optional=False)
    _seconds(name, "renewal_interval", cls.renewal_interval, optional=True)
    _seconds(name, "max_runtime", cls.max_runtime, optional=True)
    _count(name, "loss_budget", cls.loss_budget)
    _count(name, "max_result_bytes", cls.max_result_bytes)


def _seconds(name: str, attribute: str, value: object, *, optional: bool) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        kind = "a number of seconds or None" if optional else "a number of seconds"
        raise ConfigError(f"{name}.{attribute} must be {kind}, got {type(value).__name__}")
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{name}.{attribute} must be a finite number of seconds > 0, got {value}")


def _count(name: str, attribute: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name}.{attribute} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ConfigError(f"{name}.{attribute} must be >= 1, got {value}")
