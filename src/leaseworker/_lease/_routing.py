"""Lease calls on a Redis Cluster: each goes to the node that owns its key's slot.

redis-py's cluster pipeline refuses ``EVALSHA``, and ``WAIT`` must run on the
connection that wrote. So the router keeps one plain client per primary (with
the cluster's connection settings) and, with pipelining, one
:class:`ScriptPipeline` per node: the calls queued for a node go as one trip.
A ``MOVED`` (failover, resharding) patches the slot map and is sent once
more; a dead node or ``CLUSTERDOWN`` makes the next call discover the map
again; see docs/operations.md#redis-topology.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import final

from redis.asyncio import ConnectionPool, Redis, RedisCluster
from redis.exceptions import ClusterDownError, MovedError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError

from ._deadlines import DeadlineWheel
from ._pipelining import ReplicaWait, Replied, ScriptPipeline, run_script

_STALE_MAP = (ClusterDownError, TryAgainError, RedisConnectionError, OSError)
"""Failures after which the next call discovers the slot map again."""


@final
class ClusterRouter:
    """Run lease scripts on the primary that owns each call's first key."""

    def __init__(
        self,
        cluster: RedisCluster,
        scripts: Mapping[str, str],
        deadlines: DeadlineWheel,
        *,
        pipelining: bool,
        wait: ReplicaWait | None,
    ) -> None:
        self._cluster = cluster
        self._scripts = dict(scripts)  # sha -> source
        self._deadlines = deadlines
        self._pipelining = pipelining
        self._wait = wait
        self._nodes: dict[str, tuple[Redis, ScriptPipeline | None]] = {}
        self._map_known = False
        self._discovery: asyncio.Task[RedisCluster] | None = None

    async def call(self, sha: str, keys: Sequence[str], args: Sequence[str]) -> Replied:
        """Run script ``sha`` on the owner of ``keys[0]``; once more after a ``MOVED``."""
        try:
            try:
                return await self._call_once(sha, keys, args)
            except MovedError as moved:
                await self._cluster.nodes_manager.move_slot(moved)  # as redis-py itself does
                return await self._call_once(sha, keys, args)
        except _STALE_MAP:
            # As redis-py does: drop the cluster's connections and mark its map for
            # discovery at the next call (retrying now would ask the same dead node).
            self._map_known = False
            await self._cluster.aclose()
            raise

    async def client_for(self, key: str) -> Redis:
        """Return the plain client of the primary that owns ``key`` (for reads: inspect)."""
        return (await self._route(key))[0]

    async def aclose(self) -> None:
        """Close the per-node clients (the cluster client itself stays the caller's)."""
        if self._discovery is not None and not self._discovery.done():
            self._discovery.cancel()
        nodes, self._nodes = self._nodes, {}
        for client, _ in nodes.values():
            await client.aclose()

    async def _call_once(self, sha: str, keys: Sequence[str], args: Sequence[str]) -> Replied:
        client, pipeline = await self._route(keys[0])
        if pipeline is not None:
            return await pipeline.call(sha, keys, args)
        return await run_script(client, sha, self._scripts[sha], keys, args, self._wait)

    async def _discover(self) -> None:
        """Learn the slot map, in a task of its own that a caller's deadline cannot cut.

        A discovery cancelled half-way leaves redis-py's node table with open,
        unowned connections; shielded, it finishes for the calls after this one.
        """
        discovery = self._discovery
        if discovery is None or discovery.done():
            discovery = self._discovery = asyncio.create_task(self._cluster.initialize())
        await asyncio.shield(discovery)
        self._map_known = True

    async def _route(self, key: str) -> tuple[Redis, ScriptPipeline | None]:
        if not self._map_known:
            await self._discover()
        node = self._cluster.get_node_from_key(key)
        if node is None:
            raise ClusterDownError(f"no node serves the slot of {key!r}")
        found = self._nodes.get(node.name)
        if found is None:
            pool = ConnectionPool(connection_class=node.connection_class, **node.connection_kwargs)
            client = Redis.from_pool(pool)  # closing the client closes its pool
            pipeline = (
                ScriptPipeline(client, self._scripts, self._deadlines, wait=self._wait)
                if self._pipelining
                else None
            )
            found = self._nodes[node.name] = (client, pipeline)
        return found
