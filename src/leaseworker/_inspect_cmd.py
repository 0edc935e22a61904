"""``leaseworker inspect KEY``: show a job key's lease owner, TTL and last fence."""

from __future__ import annotations

import argparse
import json
from typing import Any

import anyio
from redis.asyncio import Redis

from ._cli import env_default
from ._lease import RedisLeases


def add_parser(subparsers: Any) -> None:
    """Register the ``inspect`` subcommand."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "inspect", help="show who holds a job key's lease, its TTL and last fence"
    )
    parser.add_argument("key", help="the job key, e.g. report:acme:2026-11")
    parser.add_argument(
        "--redis-url",
        default=env_default("--redis-url", "redis://127.0.0.1:6379/0"),
        help="Redis URL (env LEASEWORKER_REDIS_URL)",
    )
    parser.add_argument(
        "--namespace",
        default=env_default("--namespace", "leaseworker"),
        help="lease key prefix (env LEASEWORKER_NAMESPACE)",
    )
    parser.set_defaults(handler=_inspect)


def _inspect(args: argparse.Namespace) -> int:
    async def read() -> dict[str, object]:
        client = Redis.from_url(args.redis_url)
        try:
            info = await RedisLeases(client, namespace=args.namespace).inspect(args.key)
        finally:
            await client.aclose()
        return {"key": info.key, "owner": info.owner, "ttl": info.ttl, "fence": info.fence}

    print(json.dumps(anyio.run(read)))
    return 0
