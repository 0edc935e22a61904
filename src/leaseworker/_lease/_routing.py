"""Lease calls on a Redis Cluster: each goes to the node that owns its key's slot.

redis-py's cluster pipeline refuses ``EVALSHA``, and ``WAIT`` must run on the
connection that wrote. So the router keeps its own slot map (``CLUSTER
SLOTS``), one plain client per primary with the cluster client's connection
settings and, with pipelining, one :class:`ScriptPipeline` per node. A
``MOVED`` patches the map and the call goes once more; an ``ASK`` (a slot
in mid-migration) sends it once to the importing node after ``ASKING``; a
dead node or ``CLUSTERDOWN`` makes the next call read the map again. See
docs/operations.md#redis-topology.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Mapping, Sequence
from typing import Any, final

from redis.asyncio import ConnectionPool, Redis, RedisCluster
from redis.crc import key_slot
from redis.exceptions import AskError, ClusterDownError, MovedError, RedisError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError

from ._deadlines import DeadlineWheel
from ._pipelining import ScriptPipeline
from ._trips import Call, ReplicaWait, Replied, run_asking, run_script, run_scripts

_STALE_MAP = (ClusterDownError, TryAgainError, RedisConnectionError, OSError)
"""Failures after which the next call reads the slot map again."""

Address = tuple[str, int]

Node = tuple[Redis, ScriptPipeline | None, set[str]]
"""A primary's client, its pipeline (with pipelining) and the scripts it holds (without)."""

_CONNECT_TIMEOUT = 5.0
"""Seconds a node connect (when the cluster client sets no bound) or a map read may take."""


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
        startup = list(cluster.nodes_manager.startup_nodes.values())
        self._settings: dict[str, Any] = dict(startup[0].connection_kwargs)
        if self._settings.get("socket_connect_timeout") is None:
            self._settings["socket_connect_timeout"] = _CONNECT_TIMEOUT  # no connect hangs
        self._connection_class = startup[0].connection_class
        self._known: list[Address] = [(node.host, int(node.port)) for node in startup]
        self._scripts = dict(scripts)  # sha -> source
        self._deadlines = deadlines
        self._pipelining = pipelining
        self._wait = wait
        self._nodes: dict[Address, Node] = {}
        self._starts: list[int] = []  # first slot of each range, sorted
        self._owners: list[Address] = []  # the primary serving each range
        self._moved: dict[int, Address] = {}  # slots a MOVED reassigned since the last read
        self._discovery: asyncio.Task[None] | None = None
        self._closed = False

    async def call(
        self,
        sha: str,
        keys: Sequence[str],
        args: Sequence[str],
        *,
        replicated: bool = True,
        linger: float = 0.0,
    ) -> Replied:
        """Run script ``sha`` on the owner of ``keys[0]``; once more after a ``MOVED``.

        ``replicated=False``: no ``WAIT`` of its own; ``linger``: see
        :meth:`ScriptPipeline.call`.
        """
        try:
            try:
                return await self._call_following_ask(sha, keys, args, replicated, linger)
            except MovedError as moved:
                self._moved[moved.slot_id] = (moved.host, int(moved.port))
                return await self._call_following_ask(sha, keys, args, replicated, linger)
        except _STALE_MAP:
            self._starts, self._owners = [], []  # read the map again at the next call
            raise

    async def call_many(
        self, sha: str, calls: Sequence[Call], *, replicated: bool = True
    ) -> list[Replied]:
        """Run script ``sha`` once per call: one batch per node, a redirected call once alone.

        Errors come back as values, one per call (a node's failed trip is each
        of its calls'). Each trip is bounded by the command timeout.
        """
        nodes: dict[int, tuple[Node, list[int]]] = {}
        for i, (keys, _) in enumerate(calls):
            node = await self._route(keys[0])
            nodes.setdefault(id(node[0]), (node, []))[1].append(i)
        replies: list[Replied] = [Replied(None, None)] * len(calls)
        wait = self._wait if replicated else None

        async def on_node(node: Node, at: list[int]) -> None:
            client, pipeline, loaded = node
            batch = [calls[i] for i in at]
            try:
                if pipeline is not None:
                    got = await pipeline.call_many(sha, batch, replicated=replicated)
                else:
                    trip = run_scripts(client, sha, self._scripts[sha], batch, wait, loaded)
                    got = await self._deadlines.run(trip)
            except (RedisError, OSError) as exc:  # TimeoutError included
                got = [Replied(exc, None)] * len(batch)
            for i, reply in zip(at, got, strict=True):
                replies[i] = reply

        await asyncio.gather(*(on_node(*node) for node in nodes.values()))
        for i, reply in enumerate(replies):
            if isinstance(reply.value, AskError):  # MOVED too: call() follows it
                keys, args = calls[i]
                try:
                    alone = self.call(sha, keys, args, replicated=replicated)
                    replies[i] = await self._deadlines.run(alone)
                except (RedisError, OSError) as exc:
                    replies[i] = Replied(exc, None)
            if isinstance(replies[i].value, _STALE_MAP):
                self._starts, self._owners = [], []  # read the map again at the next call
        return replies

    async def client_for(self, key: str) -> Redis:
        """Return the plain client of the primary that owns ``key`` (for reads: inspect)."""
        return (await self._route(key))[0]

    async def aclose(self) -> None:
        """Close the per-node clients (the cluster client itself stays the caller's).

        Calls after this fail instead of opening new connections nobody closes.
        """
        self._closed = True
        discovery = self._discovery
        if discovery is not None and not discovery.done():
            # Let it end by itself (each node it asks is bounded by _CONNECT_TIMEOUT):
            # a cancelled redis-py connect can leave its socket unowned.
            await asyncio.wait((discovery,))
        nodes, self._nodes = self._nodes, {}
        for client, pipeline, _ in nodes.values():
            if pipeline is not None:
                await pipeline.aclose()
            await client.aclose()

    async def _call_following_ask(
        self, sha: str, keys: Sequence[str], args: Sequence[str], replicated: bool, linger: float
    ) -> Replied:
        """Run the call; after an ``ASK`` (its slot is migrating), once on the importing node."""
        try:
            return await self._call_once(sha, keys, args, replicated, linger)
        except MovedError:  # redis-py's MovedError is an AskError: call() handles it
            raise
        except AskError as ask:
            client, _, _ = self._node((ask.host, int(ask.port)))
            wait = self._wait if replicated else None
            return await run_asking(client, self._scripts[sha], keys, args, wait)

    async def _call_once(
        self, sha: str, keys: Sequence[str], args: Sequence[str], replicated: bool, linger: float
    ) -> Replied:
        client, pipeline, loaded = await self._route(keys[0])
        if pipeline is not None:
            return await pipeline.call(sha, keys, args, replicated=replicated, linger=linger)
        wait = self._wait if replicated else None
        return await run_script(client, sha, self._scripts[sha], keys, args, wait, loaded)

    async def _route(self, key: str) -> Node:
        if not self._starts:
            await self._discover()
        slot = key_slot(key.encode())
        address = self._moved.get(slot) or self._owners[bisect.bisect(self._starts, slot) - 1]
        return self._node(address)

    def _node(self, address: Address) -> Node:
        if self._closed:
            raise RedisConnectionError("the lease store was closed")
        found = self._nodes.get(address)
        if found is None:
            host, port = address
            settings = {**self._settings, "host": host, "port": port}
            pool = ConnectionPool(connection_class=self._connection_class, **settings)
            client = Redis.from_pool(pool)  # closing the client closes its pool
            pipeline = (
                ScriptPipeline(client, self._scripts, self._deadlines, wait=self._wait)
                if self._pipelining
                else None
            )
            found = self._nodes[address] = (client, pipeline, set())
        return found

    async def _discover(self) -> None:
        """Read the slot map, in a task of its own that a caller's deadline cannot cut.

        Callers that find the map missing share one read; a caller that gives
        up leaves it to finish for the calls after it.
        """
        discovery = self._discovery
        if discovery is None or discovery.done():
            discovery = self._discovery = asyncio.ensure_future(self._read_map())
        await asyncio.shield(discovery)

    async def _read_map(self) -> None:
        """Ask the known nodes, in turn, for ``CLUSTER SLOTS``; keep the first answer."""
        error: Exception = ClusterDownError("no cluster node answered CLUSTER SLOTS")
        for address in [*dict.fromkeys([*self._nodes, *self._known])]:
            client, _, _ = self._node(address)
            try:
                async with asyncio.timeout(_CONNECT_TIMEOUT):  # a black-holed node: ask the next
                    ranges = await client.execute_command("CLUSTER SLOTS")  # type: ignore[no-untyped-call]
            except (RedisError, OSError, TimeoutError) as exc:
                error = exc
                continue
            table = sorted(
                (int(first), (_text(owner[0]) or address[0], int(owner[1])))
                for first, _last, owner, *_replicas in ranges
            )
            if not table:
                continue  # a node that has not joined yet knows no slots
            self._starts = [first for first, _ in table]
            self._owners = [owner for _, owner in table]
            self._moved = {}
            self._known = list(dict.fromkeys([*self._owners, *self._known]))
            return
        raise error


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
