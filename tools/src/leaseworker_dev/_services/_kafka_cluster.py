"""A private three-node KRaft Kafka cluster on free loopback ports, whose brokers fail.

Each node is a :class:`LocalKafka` (``_kafka``) in combined mode, one voter
of a static three-voter quorum; every replication factor is 3 and
``min.insync.replicas`` 2, internal topics included, so ``acks=all`` waits
for a second broker and a partition stays writable with one broker down.
The three JVMs start in parallel and share LocalKafka's class-data archive.
By default every node listens on loopback; ``places`` puts each on a host of
its own (``Hosts``), advertised and voting at that host's address, so a
packet filter can cut one broker from its peers.
A node is killed (SIGKILL), stopped in order or started again by node id;
:meth:`LocalKafkaCluster.rolling_restart` restarts each in turn, waiting
until every partition is back in sync before the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from aiokafka.admin import AIOKafkaAdminClient  # type: ignore[import-untyped]
from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

from leaseworker.toolkit import create_topics

from ._kafka import LocalKafka, Quorum, _run_in_thread, random_cluster_id
from ._proc import HERE, Place, distinct_free_ports, service_workdir

__all__ = ["CLUSTER_SETTINGS", "NODE_IDS", "LocalKafkaCluster"]

NODE_IDS = (1, 2, 3)
"""The nodes' ids: each is broker and controller, a voter of the quorum."""

CLUSTER_SETTINGS: dict[str, str] = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    # A killed broker is fenced (its partitions' leaders move) after 3 s, not 9 s.
    "broker.heartbeat.interval.ms": "500",
    "broker.session.timeout.ms": "3000",
}
"""Settings over LocalKafka's ``BROKER_SETTINGS`` for every node of the cluster."""


@dataclass
class LocalKafkaCluster:
    """Three running KRaft nodes, stopped together by PID with :meth:`stop`.

    ``nodes`` maps node id to its :class:`LocalKafka`; each node's work
    directory is ``node-<id>`` in ``workdir``.
    """

    nodes: Mapping[int, LocalKafka]
    workdir: Path
    _remove_workdir: bool = field(default=False, repr=False)

    @property
    def bootstrap_servers(self) -> str:
        """Every node's ``host:port``, comma-separated, for Kafka clients."""
        return ",".join(node.bootstrap_servers for node in self.nodes.values())

    @classmethod
    def start(
        cls,
        *,
        workdir: Path | None = None,
        timeout: float = 120.0,
        settings: Mapping[str, str] | None = None,
        places: Mapping[int, Place] | None = None,
    ) -> Self:
        """Format and start the three nodes in parallel; return once each serves requests.

        ``settings`` override :data:`CLUSTER_SETTINGS` and LocalKafka's.
        ``places``: where each node id runs and listens (all three, or none:
        this host's loopback). Raises
        the first node's ``RuntimeError`` (see :meth:`LocalKafka.start`) after
        stopping the nodes that came up.
        """
        ports = distinct_free_ports(2 * len(NODE_IDS))
        client, controller = ports[: len(NODE_IDS)], ports[len(NODE_IDS) :]
        voters = dict(zip(NODE_IDS, controller, strict=True))
        where = dict(places or {})
        if where and sorted(where) != list(NODE_IDS):
            raise ValueError(f"places: one for each node id {NODE_IDS}, got {sorted(where)}")
        addresses = {node_id: place.address for node_id, place in where.items()}
        cluster_id = random_cluster_id()
        overrides = {**CLUSTER_SETTINGS, **(settings or {})}
        with service_workdir(workdir, "kafka-cluster") as (workdir, remove):
            with ThreadPoolExecutor(len(NODE_IDS), thread_name_prefix="kafka-node") as pool:
                futures = {
                    node_id: pool.submit(
                        LocalKafka.start,
                        workdir=workdir / f"node-{node_id}",
                        timeout=timeout,
                        settings=overrides,
                        quorum=Quorum(cluster_id, voters, node_id, port, addresses),
                        place=where.get(node_id, HERE),
                    )
                    for node_id, port in zip(NODE_IDS, client, strict=True)
                }
            started = {i: f.result() for i, f in futures.items() if f.exception() is None}
            failures = [e for f in futures.values() if (e := f.exception()) is not None]
            if failures:
                _stop_all(started.values())
                raise failures[0]
        return cls(nodes=started, workdir=workdir, _remove_workdir=remove)

    def stop(self, timeout: float = 15.0) -> None:
        """Stop every node by PID and remove a temporary work directory.

        Nodes whose data stays stop in order, in parallel. Those of a temporary
        directory are killed: their data goes, and an orderly stop could wait out
        ``timeout`` for a quorum gone with the others (a test's teardown took 15 s).
        """
        if not self._remove_workdir:
            _stop_all(self.nodes.values(), timeout)
            return
        for node in self.nodes.values():
            node.kill()  # each node's directory is inside the cluster's
        shutil.rmtree(self.workdir, ignore_errors=True)

    def kill(self, node_id: int) -> None:
        """SIGKILL node ``node_id``; its data stays for :meth:`up`."""
        self._node(node_id).kill()

    def down(self, node_id: int, timeout: float = 15.0) -> None:
        """Stop node ``node_id`` in order (SIGTERM: it hands its leaderships over first)."""
        self._node(node_id).down(timeout)

    def up(self, *node_ids: int, timeout: float = 60.0) -> None:
        """Start the nodes ``node_ids`` again; return once each serves requests (not yet in sync).

        Several start at once: a node's readiness asks for a group coordinator,
        which another node still down may be the only one able to lead.
        """
        nodes = [self._node(node_id) for node_id in node_ids]
        with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
            for started in [pool.submit(node.up, timeout=timeout) for node in nodes]:
                started.result()

    def rolling_restart(self, *, timeout: float = 120.0) -> None:
        """Stop and start each node in turn, waiting until every partition is in sync again."""
        self.wait_in_sync(timeout=timeout)
        for node_id in self.nodes:
            self.down(node_id)
            self.up(node_id, timeout=timeout)
            self.wait_in_sync(timeout=timeout)

    def wait_in_sync(self, *, timeout: float = 60.0) -> None:
        """Block until every partition, internal ones too, has all its replicas in its ISR."""
        _run_in_thread(lambda: self._until_in_sync(time.monotonic() + timeout))

    def leader(self, topic: str, partition: int = 0, *, via: Collection[int] = ()) -> int:
        """Return the node id leading ``topic``'s ``partition`` (-1: none right now).

        ``via``: ask only these nodes (a majority's view, not a cut node's stale one).
        """
        return self.leaders(topic, via=via)[partition]

    def leaders(self, topic: str, *, via: Collection[int] = ()) -> dict[int, int]:
        """Return the node id leading each partition of ``topic`` (``via``: see :meth:`leader`)."""
        [described] = _run_in_thread(lambda: self._admin_call("describe_topics", [topic], via=via))
        return {p["partition"]: int(p["leader"]) for p in described["partitions"]}

    def coordinator(self, group: str, *, via: Collection[int] = ()) -> int:
        """Return the node id of ``group``'s coordinator (``via``: see :meth:`leader`)."""
        return int(_run_in_thread(lambda: self._admin_call("find_coordinator", group, via=via)))

    def create_topics(
        self,
        names: Iterable[str],
        *,
        partitions: int = 1,
        exist_ok: bool = False,
        timeout: float = 30.0,
    ) -> None:
        """Create topics of replication factor 3; wait until every partition has a leader."""
        topics = list(names)
        _run_in_thread(
            lambda: create_topics(
                self.bootstrap_servers,
                topics,
                partitions=partitions,
                replication_factor=len(NODE_IDS),
                exist_ok=exist_ok,
                within=timeout,
            )
        )

    def _node(self, node_id: int) -> LocalKafka:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise KeyError(f"no Kafka node {node_id} (nodes: {sorted(self.nodes)})") from None

    def _running_bootstrap(self, via: Collection[int] = ()) -> str:
        return ",".join(
            node.bootstrap_servers
            for node_id, node in self.nodes.items()
            if node.process.popen.poll() is None and (not via or node_id in via)
        )

    async def _admin_call(self, method: str, *args: object, via: Collection[int] = ()) -> Any:
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self._running_bootstrap(via), request_timeout_ms=5000
        )
        try:
            await admin.start()
            return await getattr(admin, method)(*args)
        finally:
            await admin.close()

    async def _until_in_sync(self, deadline: float) -> None:
        last: object = None
        while time.monotonic() < deadline:
            with contextlib.suppress(KafkaError, OSError, TimeoutError):
                async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
                    topics = await self._admin_call("describe_topics")
                lagging = [
                    f"{t['topic']}-{p['partition']}"
                    for t in topics
                    for p in t["partitions"]
                    if sorted(p["isr"]) != sorted(p["replicas"])
                ]
                if not lagging:
                    return
                last = lagging
            await asyncio.sleep(0.2)
        raise TimeoutError(f"partitions not back in sync in time: {last}")


def _stop_all(nodes: Iterable[LocalKafka], timeout: float = 15.0) -> None:
    """Stop nodes in parallel: one at a time, the last would wait for a quorum long gone."""
    with ThreadPoolExecutor(3, thread_name_prefix="kafka-node-stop") as pool:
        for node in nodes:
            pool.submit(node.stop, timeout)
