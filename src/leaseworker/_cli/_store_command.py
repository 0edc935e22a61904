"""``leaseworker store migrate`` and ``store check``: the completion store's schema, its standbys.

``migrate`` is run by the schema's owner role (a Kubernetes Job, a release
step) so that the pods can run as a role that only reads and writes the
store's tables; ``--grant-to`` grants that role exactly what a pod needs. A
pod whose schema is behind and whose role may not migrate it exits 2 naming
this command. ``check`` changes nothing: it prints the schema's version and
the standbys, and warns in one line when the primary does not wait for them.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import anyio

from .._errors import ConfigError, StoreUnavailable
from ._common import Setting, action_parsers, fail, positive_seconds

STORE_URL = Setting(
    flag="--store-url",
    help="the store as its owner role: postgresql://owner:pw@host/db or sqlite:///path",
    secret=True,
)


def add_parser(subparsers: Any, summary: str) -> None:
    """Register the ``store`` subcommand (actions ``migrate`` and ``check``)."""
    migrate, check = action_parsers(
        subparsers,
        "store",
        summary,
        "Manage the completion store.",
        (
            "migrate",
            "create or migrate the schema (as its owner) and grant the pods' role its use",
            "Create or migrate the completion store's schema and print its version as JSON. "
            "Exit 2 with one line when the store refuses or cannot be reached.",
        ),
        (
            "check",
            "print the schema's version and the standbys; warn if commits skip them",
            "Print the completion store's schema version and how many standbys stream from "
            "it as JSON, changing nothing; one warning line on stderr when the primary does "
            "not wait for them (a failover would lose commits). Exit 2 with one line when "
            "the store refuses or cannot be reached.",
        ),
    )
    for parser in (migrate, check):
        STORE_URL.add_to(parser)
        parser.add_argument(
            "--timeout",
            type=positive_seconds,
            default=10.0,
            help="seconds each store call may take (default 10)",
        )
    check.set_defaults(handler=_check)
    migrate.add_argument(
        "--grant-to",
        action="append",
        default=[],
        metavar="ROLE",
        help="a PostgreSQL role the pods run as: grant it SELECT, INSERT, UPDATE on the "
        "store's tables, DELETE too on the outbox's (the relays delete what they sent), "
        "SELECT on its version table and views; repeat for several",
    )
    migrate.set_defaults(handler=_migrate)


def _migrate(args: argparse.Namespace) -> int:
    from .._store import migrate_store

    url = STORE_URL.value(args)
    if url is None:
        return _fail("--store-url (or --store-url-file) is required")
    try:
        version = anyio.run(
            lambda: migrate_store(url, grant_to=args.grant_to, call_timeout=args.timeout)
        )
    except (ConfigError, StoreUnavailable) as exc:
        return _fail(str(exc))
    print(json.dumps({"schema_version": version, "granted_to": args.grant_to}))
    return 0


def _check(args: argparse.Namespace) -> int:
    from .._store import check_store

    url = STORE_URL.value(args)
    if url is None:
        return fail("store check", "--store-url (or --store-url-file) is required")
    try:
        report = anyio.run(lambda: check_store(url, call_timeout=args.timeout))
    except (ConfigError, StoreUnavailable) as exc:
        return fail("store check", str(exc))
    for line in report.pop("warnings"):
        print(f"leaseworker store check: warning: {line}", file=sys.stderr)
    print(json.dumps(report))
    return 0


def _fail(reason: str) -> int:
    return fail("store migrate", reason)
