"""``leaseworker inspect KEY``: a job key's lease, completion state and effects.

The owner is shown masked (``pod-a:***``): the token's random part lets
whoever knows it renew or release the lease, so it never leaves the pod. The
completion part reads the fenced completion store: the winning fence, the
input version that won, when and by which execution and pod, and what that
execution's ``run_in_process`` children cost (CPU seconds, peak memory; ``null``
if it ran none, or completed before the store kept it). The stored
result is shown only with ``--show-result`` (results may carry personal data),
cut to ``--result-limit`` characters of JSON, saying so.
An embedded SQLite store that does not exist yet is reported as "no
completion", with a note on stderr naming the file that was looked for, and
is never created by looking; so is a ``memory://`` store, which lives inside
each pod. The effects are the key's outbox messages (id, topic, fence, when
committed and sent, by which pod's relay, relay claims), never their values,
keys or headers.
JSON by default (scripts read it); ``--text`` aligns the same for a person.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import anyio

from .._errors import ConfigError, LeaseError, StoreUnavailable
from .._execution import completion_key
from .._lease import RedisLeases, parse_redis_url, redis_from_url
from .._store import DEFAULT_URL, Completion, EffectStore, OutboxEntry, open_store, parse_store_url
from ._common import (
    REDIS_TLS_SETTINGS,
    Setting,
    config_default,
    env_default,
    non_negative_int,
    redis_url_with_tls,
)

_REDIS_URL = Setting(
    flag="--redis-url", help="Redis URL", default=config_default("redis_url"), secret=True
)
_STORE_URL = Setting(flag="--store-url", help="completion store", default=DEFAULT_URL, secret=True)


def add_parser(subparsers: Any, summary: str) -> None:
    """Register the ``inspect`` subcommand."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "inspect",
        help=summary,
    )
    parser.add_argument("key", help="the job key, e.g. report:acme:2026-11")
    for setting in (_REDIS_URL, *REDIS_TLS_SETTINGS):
        setting.add_to(parser)
    parser.add_argument(
        "--namespace",
        default=env_default("--namespace", config_default("namespace")),
        help="lease key prefix (env LEASEWORKER_NAMESPACE)",
    )
    _STORE_URL.add_to(parser)
    parser.add_argument(
        "--show-result",
        action="store_true",
        help="also print the stored result (it may carry personal data)",
    )
    parser.add_argument(
        "--result-limit",
        type=non_negative_int,
        default=RESULT_LIMIT,
        help="with --show-result, show at most this many characters of the result's JSON, "
        f"as result_preview (0: all of it; default {RESULT_LIMIT})",
    )
    view = parser.add_mutually_exclusive_group()
    view.add_argument(
        "--json",
        dest="text",
        action="store_false",
        help="print one JSON object (the default)",
    )
    view.add_argument(
        "--text",
        dest="text",
        action="store_true",
        help="print aligned lines for a person: the lease, the completion, one line per effect",
    )
    parser.set_defaults(handler=_inspect, text=False)


RESULT_LIMIT = 4096
"""Characters of a stored result's JSON ``inspect --show-result`` prints by default."""


def _inspect(args: argparse.Namespace) -> int:
    try:
        args.redis_url = redis_url_with_tls(args, _REDIS_URL.value(args))  # files read here
        args.store_url = _STORE_URL.value(args)
        parse_redis_url(args.redis_url)  # its message never quotes the URL (or its password)
    except ConfigError as exc:
        print(f"leaseworker inspect: error: --redis-url: {exc}", file=sys.stderr)
        return 2
    try:
        shown = anyio.run(_read, args)
    except (ConfigError, StoreUnavailable, LeaseError) as exc:  # messages leaseworker wrote
        print(f"leaseworker inspect: error: {exc}", file=sys.stderr)
        return 2
    if args.text:
        print(render_text(shown), end="")
    else:
        print(json.dumps(shown))
    return 0


REDIS_TIMEOUT = 5.0
"""Seconds inspect's one Redis read may take, its connection's handshakes included.

Not the pods' 0.5 s: that budget must end inside a lease's margin, and a late
answer is worth nothing there. A person or a script waits for this one; through
Sentinel on TLS (two handshakes) on a loaded machine, 0.5 s was not always enough.
"""


async def _read(args: argparse.Namespace) -> dict[str, object]:
    client = redis_from_url(args.redis_url)
    try:
        leases = RedisLeases(client, namespace=args.namespace, command_timeout=REDIS_TIMEOUT)
        info = await leases.inspect(args.key)
    finally:
        await client.aclose()
    completion, effects = await _stored(args)
    return {
        "key": info.key,
        "owner": info.holder,
        "ttl": info.ttl,
        "fence": info.fence,
        "completion": None if completion is None else _shown(completion, args),
        "effects": [_effect(entry) for entry in effects],
    }


async def _stored(args: argparse.Namespace) -> tuple[Completion | None, list[OutboxEntry]]:
    """Return the key's winning completion and its outbox messages, from the pods' store."""
    parsed = parse_store_url(args.store_url)
    if parsed.backend == "memory" or parsed.target == ":memory:":
        _note("memory:// lives inside each pod; no other process can see its completions")
        return None, []
    target = anyio.Path(parsed.target)
    if parsed.backend == "sqlite" and not await target.exists():  # looking must not create it
        _note(
            f"no completion store at {await target.absolute()}: nothing was ever completed "
            "there; pass the pods' --store-url (or LEASEWORKER_STORE_URL)"
        )
        return None, []
    key = completion_key(args.namespace, args.key)
    async with open_store(args.store_url) as store:
        completion = await store.state(key)
        effects = await store.outbox_entries(key) if isinstance(store, EffectStore) else []
    return completion, effects


def _effect(entry: OutboxEntry) -> dict[str, object]:
    """One effect as inspect shows it: identifiers, times and claims, never the message."""
    row = entry.row
    return {
        "effect_id": row.effect_id,
        "topic": row.message.topic,
        "fence": row.fence,
        "input_version": row.input_version,
        "state": "sent" if entry.sent else "unsent",
        "committed_at": entry.committed_at.isoformat(),
        "sent_at": None if entry.sent_at is None else entry.sent_at.isoformat(),
        "sent_by": entry.sent_by,
        "attempts": entry.attempts,
    }


def render_text(shown: dict[str, Any]) -> str:
    """Return ``inspect``'s answer as aligned lines: lease, completion, one line per effect."""
    owner = shown["owner"] or "none"
    ttl = "" if shown["ttl"] is None else f", TTL {shown['ttl']:.1f}s"
    fence = "none" if shown["fence"] is None else shown["fence"]
    lines = [f"lease       {shown['key']}: owner {owner}{ttl}, last fence {fence}"]
    done = shown["completion"]
    if done is None:
        lines.append("completion  none")
    else:
        lines.append(
            f"completion  fence {done['winning_fence']}, input {done['input_version']}, "
            f"{done['completed_at']}, execution {done['execution_id']} on {done['pod']}"
            f"{_cost(done)}"
        )
        if "result" in done or "result_preview" in done:
            result = done.get("result_preview") or json.dumps(done.get("result"))
            lines.append(f"result      {result}")
    effects = shown["effects"]
    unsent = sum(1 for e in effects if e["state"] == "unsent")
    lines.append(f"effects     {len(effects)} ({len(effects) - unsent} sent, {unsent} unsent)")
    if effects:
        head = ("effect id", "topic", "fence", "committed at", "sent at", "sent by", "attempts")
        rows = [
            (
                e["effect_id"],
                e["topic"],
                str(e["fence"]),
                e["committed_at"],
                e["sent_at"] or "unsent",
                e["sent_by"] or "-",
                str(e["attempts"]),
            )
            for e in effects
        ]
        widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
        for r in (head, *rows):
            lines.append(
                "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            )
    return "\n".join(lines) + "\n"


def _cost(done: dict[str, Any]) -> str:
    """``, CPU 1.234s, peak 42.0 MiB`` in its children, or nothing when it ran none."""
    cpu, peak = done.get("cpu_seconds"), done.get("peak_memory")
    if cpu is None and peak is None:
        return ""
    shown = "" if cpu is None else f", CPU {cpu:.3f}s"
    shown += "" if peak is None else f", peak {peak / 2**20:.1f} MiB"
    return shown + " in run_in_process"


def _note(text: str) -> None:
    print(f"leaseworker inspect: note: {text}", file=sys.stderr)


def _shown(completion: Completion, args: argparse.Namespace) -> dict[str, object]:
    shown: dict[str, object] = {
        "state": "completed",
        "winning_fence": completion.fence,
        "input_version": completion.input_version,
        "completed_at": completion.completed_at.isoformat(),
        "execution_id": completion.execution_id,
        "pod": completion.pod,
        "cpu_seconds": completion.cpu_seconds,
        "peak_memory": completion.peak_memory,
    }
    if args.show_result:
        shown.update(_result(completion.result, args.result_limit))
    return shown


def _result(result: object, limit: int) -> dict[str, object]:
    """Return the result as is, or its JSON cut to ``limit`` characters, saying so."""
    encoded = json.dumps(result, ensure_ascii=False)
    if not limit or len(encoded) <= limit:
        return {"result": result}
    print(
        f"leaseworker inspect: the result is {len(encoded)} characters of JSON; "
        f"result_preview shows the first {limit} (--result-limit 0 shows it all)",
        file=sys.stderr,
    )
    return {
        "result_preview": encoded[:limit],
        "result_truncated": True,
        "result_characters": len(encoded),
    }
