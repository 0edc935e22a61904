"""Helpers every subcommand shares: ``LEASEWORKER_*`` defaults and flag types.

A flag ``--redis-url`` can also come from ``LEASEWORKER_REDIS_URL``
(:func:`env_default`); argparse ``type`` functions give one-line errors.
"""

from __future__ import annotations

import argparse
import math
import os
from typing import Any

from .._errors import ConfigError

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("text", "json")


def env_default(flag: str, default: str | None = None) -> str | None:
    """Return ``$LEASEWORKER_<FLAG>`` or ``default`` (``--redis-url``: LEASEWORKER_REDIS_URL)."""
    return os.environ.get(env_name(flag), default)


def env_name(flag: str) -> str:
    """Return the environment variable that backs ``flag``."""
    return "LEASEWORKER_" + flag.lstrip("-").replace("-", "_").upper()


def positive_seconds(text: str) -> float:
    """Parse a flag value as a number of seconds > 0 (an argparse ``type``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (value > 0 and math.isfinite(value)):  # inf would unbound a wait
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {value}")
    return value


def flag(
    parser: argparse.ArgumentParser,
    flag: str,
    default: str | None,
    text: str,
    kind: Any = str,
) -> None:
    """Add ``flag`` with its env-var default and the default shown in its help."""
    shown = "none" if default is None else default
    parser.add_argument(
        flag,
        default=env_default(flag, default),
        type=kind,
        help=f"{text} (env {env_name(flag)}; default {shown})",
    )


def positive_int(text: str) -> int:
    """Parse a flag value as an integer >= 1 (an argparse ``type``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def port(text: str) -> int:
    """Parse a flag value as a TCP port (an argparse ``type``)."""
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {value}")
    return value


def env_switch(flag: str) -> bool:
    """Read an on/off environment variable (1/true/yes/on, 0/false/no/off, or unset)."""
    text = (env_default(flag) or "").strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off"):
        return False
    raise ConfigError(f"{env_name(flag)} must be 1 or 0 (true/false, yes/no, on/off), got {text!r}")
