"""The ``leaseworker`` command: parse flags, set up logging, hand off.

Each subcommand lives in its own module and registers itself through an
``add_parser(subparsers, summary)`` function; this module only assembles them,
and imports the module of the one subcommand being run (``--help`` lists the
others from :data:`COMMANDS` without importing them). ``demo`` and ``chaos``
belong to the tools, leaseworker-dev, whose ``leaseworker.commands`` entry
points name their modules; without it they are not listed, and running one
says in one line what to install (exit 2). The
settings of ``run`` and the connection settings of the other commands can also
come from a ``LEASEWORKER_<FLAG>`` environment variable (see
:func:`env_default`). Bad usage exits 2 with a one-line reason.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

from .._version import __version__
from ._common import LOG_FORMATS, LOG_LEVELS, env_default, env_name

Handler = Callable[[argparse.Namespace], int]

TOOLS = "leaseworker-dev"
"""The distribution that adds the commands whose module in :data:`COMMANDS` is ``None``."""

ENTRY_POINTS = "leaseworker.commands"
"""The entry-point group where the tools name those commands' modules."""

COMMANDS = {
    "demo": (None, "run the local stack demo (default) or replay the lease-expiry incident"),
    "inspect": (
        "_inspect_command",
        "show a job key's lease (owner, TTL, last fence) and its completion state",
    ),
    "run": ("_run_command", "run a worker pod for a ReportJob class"),
    "trigger": ("_trigger_command", "send one trigger (a JSON object) to a topic"),
    "topics": (
        "_topics_command",
        "create topics (for a job, its dead letters, a try-out against the demo)",
    ),
    "timeline": (
        "_timeline_command",
        "draw every execution of a job key across pods on one time axis (from Jaeger)",
    ),
    "store": ("_store_command", "manage the completion store's schema (migrate it as its owner)"),
    "chaos": (None, "run a seeded fault campaign against a job class and check the history"),
}
"""Each subcommand's module here (``None``: the tools'), its summary; in ``--help`` order."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Assemble the parser: every subcommand in full, or only ``command`` (the others by name)."""
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
    for name, (_, summary) in COMMANDS.items():
        module = command_module(name)
        if module is None:
            continue  # a tools' command, and the tools are not installed
        if command in (None, name):
            importlib.import_module(module).add_parser(subparsers, summary)
        else:
            subparsers.add_parser(name, help=summary, add_help=False)
    return parser


def command_module(name: str) -> str | None:
    """Return the module of the subcommand ``name``; ``None`` for the tools' when not installed."""
    module, _ = COMMANDS[name]
    if module is not None:
        return f"{__package__}.{module}"
    return _tool_modules().get(name)


@functools.cache
def _tool_modules() -> dict[str, str]:
    """Return the installed tools' subcommands and their modules (one read of the metadata)."""
    return {found.name: found.module for found in entry_points(group=ENTRY_POINTS)}


def chosen_command(argv: Sequence[str]) -> str:
    """Return the subcommand ``argv`` names (the first word that is not a top-level flag).

    ``""`` when it names none of :data:`COMMANDS`: the parser then lists them all by
    name and summary, importing none.
    """
    words = iter(argv)
    for word in words:
        if word == "--log-level":
            next(words, None)
        elif not word.startswith("-"):
            return word if word in COMMANDS else ""
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    argv = sys.argv[1:] if argv is None else argv
    command = chosen_command(argv)
    if command and command_module(command) is None:
        print(
            f"leaseworker {command}: install {TOOLS} for it (pip install {TOOLS})", file=sys.stderr
        )
        return 2
    parser = build_parser(command)
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
