"""``leaseworker timeline KEY``: every execution of a job key across pods, on one time axis.

The executions come from Jaeger (every trace carrying the job key, found by
tag search) or, with ``--from FILE``, from a recorded history (a
``leaseworker.history/1`` document such as a fault campaign writes, or a
saved Jaeger answer); both are drawn by the same timeline component. Text
goes to the terminal; ``--html FILE`` writes a self-contained page.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from .._history import History
from .._timeline import (
    JaegerError,
    JaegerQuery,
    history_from_spans,
    render_html,
    render_text,
    spans_from_document,
)
from ._common import Setting, duration, env_default, positive_int

DEFAULT_JAEGER = "http://127.0.0.1:16686"


def add_parser(subparsers: Any, summary: str) -> None:
    """Register the ``timeline`` subcommand."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "timeline",
        help=summary,
        description="Find every trace of KEY in Jaeger and draw one lane per pod: each "
        "execution from acquiring the lease to letting it go, its renewals, loss, stop, "
        "completion answer and offset commit, and any overlap between executions.",
    )
    parser.add_argument("key", nargs="?", help="the job key, e.g. report:acme:2026-11")
    parser.add_argument(
        "--jaeger",
        default=env_default("--jaeger", DEFAULT_JAEGER),
        help=f"Jaeger query service URL (env LEASEWORKER_JAEGER; default {DEFAULT_JAEGER})",
    )
    Setting(
        flag="--jaeger-ca-file",
        help="CA bundle (PEM) for an https:// Jaeger; unset: system CAs",
    ).add_to(parser)
    parser.add_argument(
        "--service",
        default=os.environ.get("OTEL_SERVICE_NAME") or "leaseworker",
        help="the pods' service name (env OTEL_SERVICE_NAME; default leaseworker)",
    )
    parser.add_argument(
        "--since",
        type=duration,
        default="1h",
        help="how far back to search: 90s, 10m, 2h, 1d (default 1h)",
    )
    parser.add_argument(
        "--limit", type=positive_int, default=500, help="traces to fetch at most (default 500)"
    )
    parser.add_argument(
        "--from",
        dest="source",
        type=Path,
        help="draw a recorded history (JSON document or record file) or a saved Jaeger "
        "answer instead of asking Jaeger",
    )
    parser.add_argument("--html", type=Path, help="also write the timeline as an HTML page")
    parser.add_argument("--json", type=Path, help="also write the history as a JSON document")
    parser.add_argument(
        "--width", type=positive_int, default=100, help="text width in columns (default 100)"
    )
    parser.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="ANSI colours: auto (a terminal without NO_COLOR), always, never",
    )
    parser.set_defaults(handler=_timeline)


def _timeline(args: argparse.Namespace) -> int:
    try:
        history = _history(args)
    except (JaegerError, OSError, ValueError) as exc:
        print(f"leaseworker timeline: error: {exc}", file=sys.stderr)
        return 2
    if not history.executions:
        where = f"{args.source}" if args.source else f"{args.jaeger} (service {args.service})"
        what = f"of {args.key} " if args.key else ""
        print(f"leaseworker timeline: no executions {what}found in {where}", file=sys.stderr)
        return 1
    color = args.color == "always" or (
        args.color == "auto" and sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    )
    print(render_text(history, width=args.width, color=color), end="", flush=True)
    title = f"leaseworker timeline: {args.key}" if args.key else "leaseworker timeline"
    if args.html is not None:
        args.html.write_text(render_html(history, title=title), encoding="utf-8")
        print(f"HTML timeline written to {args.html}")
    if args.json is not None:
        args.json.write_text(history.to_json() + "\n", encoding="utf-8")
        print(f"history written to {args.json}")
    return 0


def _history(args: argparse.Namespace) -> History:
    if args.source is not None:
        return _from_file(args.source, args.key)
    if not args.key:
        raise ValueError("give a job key (or --from FILE)")
    query = JaegerQuery(args.jaeger, service=args.service, ca_file=args.jaeger_ca_file or None)
    found = query.job_key(args.key, since=args.since, limit=args.limit)
    if found.truncated:
        print(
            f"leaseworker timeline: warning: {found.api} returned the limit of {args.limit} "
            "traces; older executions may be missing (raise --limit or shorten --since)",
            file=sys.stderr,
        )
    return history_from_spans(found.spans, args.key)


def _from_file(path: Path, key: str | None) -> History:
    text = path.read_text(encoding="utf-8")
    try:
        history = History.from_json(text)
    except ValueError:
        try:
            document = json.loads(text)
        except ValueError:
            raise ValueError(f"{path}: neither a history nor a Jaeger answer") from None
        history = history_from_spans(spans_from_document(document), key)
    return history.of_key(key) if key else history
