"""Helpers every subcommand shares: ``LEASEWORKER_*`` defaults, flag rows and flag types.

A flag ``--redis-url`` can also come from ``LEASEWORKER_REDIS_URL``
(:func:`env_default`) and defaults to PodConfig's own default
(:func:`config_default`); a :class:`Setting` or :class:`Switch` is one row of
a command's flag table; argparse ``type`` functions give one-line errors.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from .._secrets import SecretFile
from .._version import __version__

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("text", "json")


def env_default(flag: str, default: str | None = None) -> str | None:
    """Return ``$LEASEWORKER_<FLAG>`` or ``default`` (``--redis-url``: LEASEWORKER_REDIS_URL)."""
    return os.environ.get(env_name(flag), default)


def env_name(flag: str) -> str:
    """Return the environment variable that backs ``flag``."""
    return "LEASEWORKER_" + dest(flag).upper()


def dest(flag: str) -> str:
    """Return the attribute argparse stores ``flag`` under (``--redis-url``: ``redis_url``)."""
    return flag.lstrip("-").replace("-", "_")


def positive_seconds(text: str) -> float:
    """Parse a flag value as a number of seconds > 0 (an argparse ``type``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (value > 0 and math.isfinite(value)):  # inf would unbound a wait
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {value}")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class Setting:
    """One flag that takes a value, backed by ``LEASEWORKER_<FLAG>``; its help names both.

    ``default`` is flag text, parsed by ``kind`` like a value given on the
    command line (argparse does that for string defaults), so a bad
    environment variable fails the way a bad flag does. ``field`` names the
    :class:`~leaseworker.PodConfig` field the value goes to, if any; an
    empty value of a setting that defaults to none means none.
    """

    flag: str
    help: str
    default: str | None = None
    kind: Callable[[str], Any] = str
    choices: tuple[str, ...] | None = None
    field: str | None = None
    secret: bool = False

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Add the flag with its env-var default and the default shown in its help.

        A ``secret`` setting gets a second flag, ``<flag>-file`` (env
        ``LEASEWORKER_<FLAG>_FILE``), naming a file that holds the value.
        """
        shown = "none" if self.default is None else self.default
        parser.add_argument(
            self.flag,
            default=env_default(self.flag, self.default),
            type=self.kind,
            choices=self.choices,
            help=f"{self.help} (env {env_name(self.flag)}; default {shown})",
        )
        if self.secret:
            parser.add_argument(
                self.file_flag,
                default=env_default(self.file_flag),
                metavar="PATH",
                help=f"read {self.flag} from this file instead, again on every reconnect "
                f"(a mounted Secret; env {env_name(self.file_flag)})",
            )

    @property
    def file_flag(self) -> str:
        """The flag naming a file that holds a ``secret`` setting's value."""
        return f"{self.flag}-file"

    def value(self, args: argparse.Namespace) -> Any:
        """Return the parsed value (``None`` for an empty value of a setting without default).

        A ``secret`` setting given as a file is read from it now (ConfigError if it cannot
        be, or if the value is given as a flag as well); the file wins over the value's
        environment variable.
        """
        value = getattr(args, dest(self.flag))
        source = self.file(args)
        if source is not None:
            if value not in (None, "", self.default, env_default(self.flag)):
                raise ConfigError(f"give {self.flag} or {self.file_flag}, not both")
            return self.kind(source.read())
        return None if value == "" and self.default is None else value

    def file(self, args: argparse.Namespace) -> SecretFile | None:
        """Return the file a ``secret`` setting is to be read from, if one is given."""
        path = getattr(args, dest(self.file_flag), None) if self.secret else None
        return SecretFile(Path(path), self.file_flag) if path else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Switch:
    """One flag without a value that sets ``field`` to ``sets``; ``LEASEWORKER_<FLAG>=1`` too.

    ``shown`` is how the help states the field's value without the switch.
    """

    flag: str
    help: str
    field: str
    sets: bool
    shown: str

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Add the switch; its help names the variable that turns it on."""
        parser.add_argument(
            self.flag,
            action="store_true",
            help=f"{self.help} (env {env_name(self.flag)}=1; {self.shown})",
        )

    def value(self, args: argparse.Namespace) -> bool:
        """Return ``sets`` if the flag or its variable is on, otherwise the opposite."""
        on = getattr(args, dest(self.flag)) or env_switch(self.flag)
        return self.sets if on else not self.sets


def non_negative_int(text: str) -> int:
    """Parse a flag value as an integer >= 0 (an argparse ``type``)."""
    return _int_at_least(text, 0)


def positive_int(text: str) -> int:
    """Parse a flag value as an integer >= 1 (an argparse ``type``)."""
    return _int_at_least(text, 1)


def _int_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
    return value


def port(text: str) -> int:
    """Parse a flag value as a TCP port (an argparse ``type``)."""
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {value}")
    return value


def config_default(name: str) -> str | None:
    """Return PodConfig's default for field ``name`` as flag text (seconds without ``.0``)."""
    from .._worker import PodConfig  # here: `leaseworker demo` and `--help` load no worker

    [found] = [f for f in dataclasses.fields(PodConfig) if f.name == name]
    if found.default_factory is not dataclasses.MISSING:
        default = found.default_factory()
    else:
        default = found.default
    if default is None:
        return None
    return f"{default:g}" if isinstance(default, float) else str(default)


def env_switch(flag: str) -> bool:
    """Read an on/off environment variable (1/true/yes/on, 0/false/no/off, or unset)."""
    text = (env_default(flag) or "").strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off"):
        return False
    raise ConfigError(f"{env_name(flag)} must be 1 or 0 (true/false, yes/no, on/off), got {text!r}")


REDIS_TLS_SETTINGS = (
    Setting(flag="--redis-ca-file", help="CA bundle the Redis servers' certificates chain to"),
    Setting(flag="--redis-cert-file", help="client certificate (PEM) for Redis mutual TLS"),
    Setting(flag="--redis-key-file", help="the client certificate's unencrypted key (PEM)"),
)
"""TLS files for a ``rediss://`` URL of any topology; the URL's own query options win."""


def redis_url_with_tls(args: argparse.Namespace, url: str) -> str:
    """Return ``url`` with ``--redis-ca-file``, ``-cert-file``, ``-key-file`` as TLS options."""
    from .._lease import with_tls_files

    cafile, certfile, keyfile = (row.value(args) for row in REDIS_TLS_SETTINGS)
    files = {"ssl_ca_certs": cafile, "ssl_certfile": certfile, "ssl_keyfile": keyfile}
    return with_tls_files(url, files)


def job_parser(subparsers: Any, name: str, summary: str, description: str) -> Any:
    """Register a subcommand taking a ``pkg.module:JobClass`` (``run``, ``chaos``); return it.

    Both take the job the same way and answer ``--version``; their own flags follow.
    """
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help=summary, description=description
    )
    parser.add_argument("--version", action="version", version=f"leaseworker {__version__}")
    parser.add_argument("job", metavar="pkg.module:JobClass", help="the ReportJob subclass to run")
    return parser


def action_parser(subparsers: Any, name: str, summary: str, description: str, action: Any) -> Any:
    """Register ``name ACTION`` with its one action; return the action's parser.

    ``store migrate`` and ``topics create`` are spelled so that more actions can
    follow. ``action`` is ``(name, help line, description)``.
    """
    return action_parsers(subparsers, name, summary, description, action)[0]


def action_parsers(
    subparsers: Any, name: str, summary: str, description: str, *actions: Any
) -> list[Any]:
    """Register ``name ACTION`` with each of ``actions``; return their parsers, in order."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help=summary, description=description
    )
    chosen = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    return [
        chosen.add_parser(action_name, help=action_help, description=action_description)
        for action_name, action_help, action_description in actions
    ]


def fail(command: str, reason: str) -> int:
    """Print ``leaseworker COMMAND: error: REASON`` on stderr; return 2, a permanent failure."""
    print(f"leaseworker {command}: error: {reason}", file=sys.stderr)
    return 2


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> float:
    """Parse ``90s``, ``10m``, ``2h``, ``1d`` or plain seconds (an argparse ``type``)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if match is None or float(match[1]) <= 0:
        raise argparse.ArgumentTypeError(f"not a duration such as 90s, 10m, 2h or 1d: {text!r}")
    return float(match[1]) * _UNITS[match[2] or "s"]
