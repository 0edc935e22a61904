"""A local Redis Cluster: six ``redis-server`` nodes, three shards of a master and a replica.

For the cluster scenarios of the replicated-lease tests (failovers, moved
slots), on real processes stopped by PID; each operation returns once every
live node agrees on the slot map. See docs/design.md#development-services.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self, final

from redis.asyncio.cluster import ClusterNode
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from ._nodes import (
    RedisNode,
    cut_off,
    fields,
    in_thread,
    installed,
    listen_config,
    poll_until,
    write_config,
)
from ._proc import HERE, Place, distinct_free_ports, run_captured
from ._redis import protected_mode, tls_query
from ._tls import ServiceTLS

SHARDS = 3
NODES = SHARDS * 2

_ALL_SLOTS = str(REDIS_CLUSTER_HASH_SLOTS)

_RETRY_AFTER = 10.0
"""Seconds before ``CLUSTER FAILOVER`` is sent again: Redis gives up a manual
failover after 5 s when the replica cannot catch up in time."""

_HEALTHY_FLAGS = frozenset({"myself", "master", "slave", "fail", "nofailover"})
"""``CLUSTER NODES`` flags of a settled view; ``fail?`` (suspected), ``handshake`` and
``noaddr`` are transient and mean the nodes are still talking it over."""


@dataclass(frozen=True)
class _Entry:
    """One node as one ``CLUSTER NODES`` line describes it, minus what differs per viewer."""

    node_id: str
    port: int
    role: str
    master_id: str
    failed: bool
    slots: tuple[str, ...]


@final
@dataclass
class LocalRedisCluster:
    """A running six-node cluster: ``nodes`` in port order, three shards of two.

    - ``timeout``: seconds each operation may wait for its effect.

    ``cluster-node-timeout`` is 2000 ms by default: a killed master is replaced
    within a few seconds, yet a node starved of CPU for a second on a busy
    runner is not failed over by mistake.
    """

    workdir: Path
    nodes: list[RedisNode] = field(default_factory=list)
    timeout: float = 60.0
    _ids: dict[int, str] = field(default_factory=dict)
    _shards: list[frozenset[int]] = field(default_factory=list)
    _migrating: dict[int, RedisNode] = field(default_factory=dict)
    tls: ServiceTLS | None = None

    @classmethod
    def start(
        cls,
        *,
        node_timeout_ms: int = 2000,
        timeout: float = 60.0,
        tls: ServiceTLS | None = None,
        places: Sequence[Place] = (),
    ) -> Self:
        """Start six nodes, join them with ``redis-cli --cluster create``; wait until ok.

        ``tls``: every node serves TLS only, the cluster bus included (``tls-cluster yes``).
        ``places``: where each node runs and listens (a network namespace of
        ``Hosts`` each); all on this host's loopback without.
        """
        if places and len(places) != NODES:
            raise ValueError(f"places: one per node, {NODES}, not {len(places)}")
        server_bin, cli_bin = _binaries()
        workdir = Path(tempfile.mkdtemp(prefix="leaseworker-cluster-"))
        cluster = cls(workdir=workdir, timeout=timeout, tls=tls)
        try:
            ports = distinct_free_ports(2 * NODES)  # a client port and a bus port each
            for index in range(NODES):
                bus_port = ports[NODES + index]
                place = places[index] if places else HERE
                cluster.nodes.append(
                    cluster._start_node(
                        server_bin, index, (place, ports[index], bus_port), node_timeout_ms
                    )
                )
            cluster._create(cli_bin)
            cluster._ids = {
                node.port: str(node.command("CLUSTER", "MYID")) for node in cluster.nodes
            }
            poll_until(cluster._settled, timeout=timeout, what="the cluster to settle")
            cluster._shards = cluster._shards_from(cluster._view())
        except BaseException:
            cluster.stop()
            raise
        return cluster

    # -- what clients and tests see

    def startup_nodes(self) -> list[ClusterNode]:
        """Return new ``ClusterNode`` objects, one per live node, for ``RedisCluster``.

        New on every call: redis-py's ``ClusterNode`` holds its connections, so
        two clients must not share one.
        """
        return [ClusterNode(*node.address) for node in self.nodes if node.alive]

    @property
    def url(self) -> str:
        """``redis+cluster://host:port,...`` over every node, the URL ``--redis-url`` takes."""
        hosts = ",".join(f"{host}:{port}" for host, port in (n.address for n in self.nodes))
        if self.tls is None:
            return f"redis+cluster://{hosts}"
        return f"rediss+cluster://{hosts}?{tls_query(self.tls)}"

    def shard_nodes(self, shard: int) -> list[RedisNode]:
        """Return the two nodes of ``shard``, in port order, whatever their roles now."""
        return [node for node in self.nodes if node.port in self._shards[shard]]

    async def shard_master(self, shard: int) -> RedisNode:
        """Return the node serving ``shard``'s slots now."""
        return await in_thread(lambda: self._master_of(shard, self._view()))

    async def slot_owner(self, slot: int) -> RedisNode:
        """Return the master serving ``slot`` now."""
        return await in_thread(lambda: self._owner(slot, self._view()))

    async def shard_of(self, key: str | bytes) -> int:
        """Return the shard whose master serves ``key``'s slot now."""
        owner = await self.slot_owner(slot_of(key))
        return self._shard_index(owner.port)

    # -- failures to replay

    async def failover(self, shard: int) -> RedisNode:
        """``CLUSTER FAILOVER`` on ``shard``'s replica; return it once master everywhere.

        A manual failover loses nothing: the master pauses its clients until
        the replica has caught up, then the replica takes over and the old
        master becomes its replica.
        """
        return await in_thread(lambda: self._failover(shard))

    async def kill_master(self, shard: int) -> RedisNode:
        """SIGKILL ``shard``'s master; return the replica the cluster promotes instead."""
        master = await self.shard_master(shard)
        self.kill(master)
        return await self.wait_for_promotion(shard)

    def kill(self, node: RedisNode) -> None:
        """SIGKILL ``node`` and return at once, before the cluster notices.

        For scenarios that act between the crash and the promotion (resume a
        paused replica, then :meth:`wait_for_promotion`).
        """
        node.kill()

    async def wait_for_promotion(self, shard: int) -> RedisNode:
        """Return ``shard``'s master once it is a running node and the cluster is settled.

        After a crash the survivors keep naming the dead master (and say
        ``cluster_state:ok``) until the node timeout passes; this waits past that.
        """
        return await in_thread(lambda: self._wait_master(shard, lambda node: True))

    async def migrate_slot(self, slot: int, to: RedisNode, *, finish: bool = True) -> None:
        """Move ``slot`` and its keys from its master to the master ``to``.

        ``IMPORTING`` on ``to``, ``MIGRATING`` on the owner, ``MIGRATE`` of every
        key in the slot, then ``SETSLOT ... NODE`` on every master. With
        ``finish=False`` the slot is left mid-migration after the keys moved:
        the old owner answers ``ASK`` for them (and the new one serves them only
        after ``ASKING``) until :meth:`finish_slot_migration`. Once finished,
        any client that still asks the old owner gets ``MOVED``.
        """
        await in_thread(lambda: self._migrate_slot(slot, to, finish=finish))

    async def finish_slot_migration(self, slot: int) -> None:
        """Assign a slot left mid-migration to its new master; return once every node agrees."""
        await in_thread(lambda: self._finish_migration(slot))

    async def settle(self) -> None:
        """Bring the cluster back to health: continue paused nodes, restart killed ones.

        A restarted node reads its config file, learns that its shard failed
        over while it was away, and rejoins as the replica. A slot left
        mid-migration is finished. Returns once every node runs and the
        cluster is settled as after :meth:`start`.
        """
        await in_thread(self._settle)

    def pause(self, node: RedisNode) -> None:
        """SIGSTOP ``node``; returns once stopped (the cluster fails it over after the timeout).

        Writes to a paused replica wait in its socket buffer and are applied on
        :meth:`resume`, even if its master died meanwhile; :meth:`cut_off` loses them.
        """
        node.pause()

    async def cut_off(self, shard: int) -> RedisNode:
        """Pause ``shard``'s replica and drop its link at the master; return the replica.

        Later writes to the shard never reach it: ``cut_off``, write, :meth:`kill`
        the master, :meth:`resume` the replica, :meth:`wait_for_promotion`, and
        the shard's new master lacks the write.
        """

        def cut() -> RedisNode:
            master = self._master_of(shard, self._view())
            replica = next(n for n in self.shard_nodes(shard) if n is not master)
            cut_off(replica, master)
            return replica

        return await in_thread(cut)

    def resume(self, node: RedisNode) -> None:
        """SIGCONT a paused ``node``; returns once it runs."""
        node.resume()

    def stop(self) -> None:
        """Stop every node by PID and remove the work directory with its config files."""
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    # -- starting

    def _start_node(
        self, binary: str, index: int, listen: tuple[Place, int, int], node_timeout_ms: int
    ) -> RedisNode:
        """Start one cluster-enabled node, its config file and data in its own directory.

        ``listen``: where it runs, its client port and its bus port.

        The bus port is set (``cluster-port``) rather than left at port + 10000:
        that one would fall in the kernel's ephemeral range, where an outgoing
        connection may take it before the node binds it (see ``free_port``).
        """
        place, port, bus_port = listen
        name = f"node{index}"
        directory = self.workdir / name
        config = directory / "redis.conf"
        write_config(
            config,
            [
                *listen_config(port, self.tls),
                *([] if self.tls is None else ["tls-cluster yes"]),
                f"bind {place.address}",
                f"protected-mode {protected_mode(place)}",
                "daemonize no",
                f"dir {directory}",
                'save ""',
                "appendonly no",
                "repl-diskless-sync yes",
                "repl-diskless-sync-delay 0",
                "cluster-enabled yes",
                f"cluster-port {bus_port}",
                f"cluster-config-file {directory / 'nodes.conf'}",
                f"cluster-node-timeout {node_timeout_ms}",
                # Promote whatever the replica has: a lost lease is what the tests look for.
                "cluster-replica-validity-factor 0",
                # A shard stays its two nodes: a replica never wanders off to another master.
                "cluster-allow-replica-migration no",
            ],
        )
        log = self.workdir / f"{name}.log"
        argv = [binary, str(config)]
        return RedisNode.start(name, argv, port=port, log_path=log, tls=self.tls, place=place)

    def _create(self, cli: str) -> None:
        """Run ``redis-cli --cluster create`` over the nodes, one replica per master."""
        addresses = [f"{host}:{port}" for host, port in (node.address for node in self.nodes)]
        argv = [cli, "--cluster", "create", *addresses, "--cluster-replicas", "1", "--cluster-yes"]
        if self.tls is not None:
            argv += ["--tls", "--cacert", str(self.tls.server.ca)]
            argv += ["--cert", str(self.tls.client.cert), "--key", str(self.tls.client.key)]
        result = run_captured(argv, cwd=self.workdir, timeout=self.timeout)
        if result.returncode != 0:
            output = result.stdout.decode(errors="replace")
            raise RuntimeError(f"redis-cli --cluster create failed:\n{output}")

    # -- observing

    def _view(self) -> frozenset[_Entry]:
        """Return what the first live node says about every node (``CLUSTER NODES``)."""
        node = next(node for node in self.nodes if node.alive and not node.paused)
        return _parse_nodes(str(node.command("CLUSTER", "NODES")))

    def _settled(self) -> bool:
        """Whether every live node says ``cluster_state:ok`` and they all agree."""
        live = [node for node in self.nodes if node.alive and not node.paused]
        for node in live:
            info = fields(str(node.command("CLUSTER", "INFO")))
            if (info.get("cluster_state"), info.get("cluster_slots_ok")) != ("ok", _ALL_SLOTS):
                return False
        views = {_parse_nodes(str(node.command("CLUSTER", "NODES"))) for node in live}
        if len(views) != 1:
            return False
        view = views.pop()
        return len(view) == NODES and all(e.role in ("master", "slave") for e in view)

    def _shards_from(self, view: frozenset[_Entry]) -> list[frozenset[int]]:
        """Each master's port with its replicas' ports, ordered by the master's first slot."""
        masters = sorted((e for e in view if e.slots), key=lambda e: _first_slot(e.slots))
        return [
            frozenset({m.port} | {e.port for e in view if e.master_id == m.node_id})
            for m in masters
        ]

    def _node_at(self, port: int) -> RedisNode:
        return next(node for node in self.nodes if node.port == port)

    def _shard_index(self, port: int) -> int:
        return next(index for index, ports in enumerate(self._shards) if port in ports)

    def _master_of(self, shard: int, view: frozenset[_Entry]) -> RedisNode:
        """Return the node of ``shard`` that serves slots in ``view``."""
        entry = next(e for e in view if e.port in self._shards[shard] and e.slots and not e.failed)
        return self._node_at(entry.port)

    def _owner(self, slot: int, view: frozenset[_Entry]) -> RedisNode:
        entry = next(e for e in view if any(_covers(r, slot) for r in e.slots))
        return self._node_at(entry.port)

    def _wait_master(
        self, shard: int, accept: Callable[[RedisNode], bool], *, timeout: float | None = None
    ) -> RedisNode:
        """Wait until the cluster is settled and ``shard``'s master runs and is ``accept``-ed."""
        found: list[RedisNode] = []

        def promoted() -> bool:
            if not self._settled():
                return False
            master = self._master_of(shard, self._view())
            found[:] = [master] if master.alive and not master.paused and accept(master) else []
            return bool(found)

        what = f"a running master for shard {shard}"
        poll_until(promoted, timeout=self.timeout if timeout is None else timeout, what=what)
        return found[0]

    # -- acting

    def _failover(self, shard: int) -> RedisNode:
        """Ask the replica to take over, again if a manual failover timed out (after 5 s)."""
        master = self._master_of(shard, self._view())
        replica = next(n for n in self.shard_nodes(shard) if n is not master)
        deadline = time.monotonic() + self.timeout
        while True:
            replica.command("CLUSTER", "FAILOVER")
            try:
                return self._wait_master(shard, lambda node: node is replica, timeout=_RETRY_AFTER)
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise

    def _migrate_slot(self, slot: int, to: RedisNode, *, finish: bool) -> None:
        source = self._owner(slot, self._view())
        if source is to:
            raise ValueError(f"slot {slot} is already served by {to.name}")
        to.command("CLUSTER", "SETSLOT", slot, "IMPORTING", self._ids[source.port])
        source.command("CLUSTER", "SETSLOT", slot, "MIGRATING", self._ids[to.port])
        while keys := source.command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            with source.client(decode=False) as client:  # keys may not be text
                host, port = to.address
                client.execute_command("MIGRATE", host, port, "", 0, 5000, "KEYS", *keys)
        self._migrating[slot] = to
        if finish:
            self._finish_migration(slot)

    def _finish_migration(self, slot: int) -> None:
        to = self._migrating.pop(slot)
        view = self._view()
        masters = [self._node_at(e.port) for e in view if e.role == "master" and not e.failed]
        for node in sorted(masters, key=lambda n: n is not to):  # the new owner first
            node.command("CLUSTER", "SETSLOT", slot, "NODE", self._ids[to.port])

        def moved() -> bool:
            return self._settled() and self._owner(slot, self._view()) is to

        poll_until(moved, timeout=self.timeout, what=f"slot {slot} to be served by {to.name}")

    def _settle(self) -> None:
        for node in self.nodes:
            if node.paused:
                node.resume()
            elif not node.alive:
                node.restart()
        for slot in list(self._migrating):
            self._finish_migration(slot)
        poll_until(self._replicating, timeout=self.timeout, what="every replica to sync")

    def _replicating(self) -> bool:
        """Whether the cluster is settled and every replica's link to its master is up."""
        if not self._settled():
            return False
        replicas = [n for n in self.nodes if n.role()[0] == "slave"]
        return len(replicas) == NODES - SHARDS and all(
            n.info("replication").get("master_link_status") == "up" for n in replicas
        )


def slot_of(key: str | bytes) -> int:
    """Return the hash slot of ``key`` (of its ``{hash tag}`` if it has one)."""
    return key_slot(key.encode() if isinstance(key, str) else key)


def _parse_nodes(text: str) -> frozenset[_Entry]:
    """``CLUSTER NODES`` as entries that compare equal between nodes that agree.

    ``myself``, ping times and migration markers (``[slot->-id]``) are left out:
    they differ per viewer or mid-migration. A transient flag (``fail?``) is
    kept in the role, so two views agree only once the nodes have settled.
    """
    entries = set()
    for line in text.splitlines():
        node_id, address, flags, master_id, _ping, _pong, _epoch, _link, *slots = line.split()
        flag_set = set(flags.split(","))
        role = "master" if "master" in flag_set else "slave"
        if not flag_set <= _HEALTHY_FLAGS:
            role = flags  # unsettled: never equal to a settled view
        port = int(address.split("@", 1)[0].rsplit(":", 1)[1])
        kept = tuple(s for s in slots if not s.startswith("["))
        entries.add(_Entry(node_id, port, role, master_id, "fail" in flag_set, kept))
    return frozenset(entries)


def _covers(slot_range: str, slot: int) -> bool:
    low, _, high = slot_range.partition("-")
    return int(low) <= slot <= int(high or low)


def _first_slot(slots: tuple[str, ...]) -> int:
    return min(int(s.partition("-")[0]) for s in slots)


def _binaries() -> tuple[str, str]:
    """Paths of ``redis-server`` and ``redis-cli``, or a message naming the fix."""
    server, cli = installed(
        "redis-server",
        "redis-cli",
        hint="it installs Debian's redis-server package, which brings redis-cli",
    )
    return server, cli
