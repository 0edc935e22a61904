"""The ``leaseworker`` command: parse flags, set up logging, hand off.

Each subcommand lives in its own module and registers itself through an
``add_parser(subparsers)`` function; this module only assembles them. The
settings of ``run`` and the connection settings of the other commands can also
come from a ``LEASEWORKER_<FLAG>`` environment variable (see
:func:`env_default`). Bad usage exits 2 with a one-line reason.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Sequence

from .._version import __version__
from ._common import LOG_FORMATS, LOG_LEVELS, env_default, env_name

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    """Assemble the parser from every subcommand module."""
    from . import _chaos, _demo, _inspect, _run, _store, _timeline, _topics, _trigger

    parser = argparse.ArgumentParser(
        prog="leaseworker",
        description="Run long jobs safely across many worker pods.",
    )
    parser.add_argument("--version", action="version", version=f"leaseworker {__version__}")
    parser.add_argument(
        "--log-level",
        default=env_default("--log-level", "INFO"),
        type=str.upper,
        choices=LOG_LEVELS,
        help="log verbosity (env LEASEWORKER_LOG_LEVEL; default INFO)",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (_demo, _inspect, _run, _trigger, _topics, _store, _timeline, _chaos):
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    parser = build_parser()
    args, unrecognized = parser.parse_known_args(argv)
    if unrecognized:
        parser.error(unrecognized_message(parser, unrecognized, args.command))
    # argparse checks ``choices`` on the command line only, not on defaults (the env).
    if args.log_level not in LOG_LEVELS:
        parser.error(f"{env_name('--log-level')}: must be one of {', '.join(LOG_LEVELS)}")
    if getattr(args, "log_format", "text") not in LOG_FORMATS:
        parser.error(f"{env_name('--log-format')}: must be one of {', '.join(LOG_FORMATS)}")
    _setup_logging(args.log_level, getattr(args, "log_format", "text"))
    handler: Handler = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130


def unrecognized_message(
    parser: argparse.ArgumentParser, unrecognized: Sequence[str], command: str
) -> str:
    """Say which arguments were not understood, and where a misplaced top-level flag goes.

    ``leaseworker run X --log-level DEBUG``: ``--log-level`` belongs to
    ``leaseworker`` itself, before the subcommand.
    """
    message = f"unrecognized arguments: {' '.join(unrecognized)}"
    top_level = {
        option
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--version"
    }
    misplaced = [arg.split("=", 1)[0] for arg in unrecognized if arg.split("=", 1)[0] in top_level]
    if misplaced:
        flag = misplaced[0]
        message += f" ({flag} goes before the command: leaseworker {flag} ... {command} ...)"
    return message


def _setup_logging(level: str, log_format: str) -> None:
    """Log to stderr as text with the lifecycle fields, or as JSON (``--log-format json``)."""
    from .._telemetry import JsonFormatter, TextFormatter

    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logging.basicConfig(level=level, handlers=[handler])
