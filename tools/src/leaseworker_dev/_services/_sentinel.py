"""A local Sentinel group: a master, its replicas and three sentinels, from Debian's packages.

For the failover scenarios of the replicated-lease tests, on real processes
stopped by PID; each operation returns once its effect is observable.
See docs/design.md#development-services.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self, cast, final

import redis
from redis.asyncio import Redis
from redis.asyncio.sentinel import Sentinel

from ._nodes import (
    RedisNode,
    cut_off,
    in_thread,
    installed,
    listen_config,
    pairs,
    poll_until,
    write_config,
)
from ._proc import HERE, Place, distinct_free_ports
from ._redis import protected_mode, tls_query
from ._sentinel_nodes import Role, follows, in_tilt, role_of
from ._tls import ServiceTLS

SENTINELS = 3
QUORUM = 2
"""Sentinels that must agree the master is down: a majority of three, as in production."""

FAILOVER_ATTEMPTS = 5
"""Failovers :meth:`LocalSentinelGroup.failover` requests of a Sentinel that aborts them."""

TILT_PERIOD = 30.0
"""Seconds a sentinel stays in TILT once its timer runs on time again (Redis's own constant)."""


class FailoverAborted(RuntimeError):
    """Raised by :meth:`LocalSentinelGroup.failover` when Sentinel aborted every failover.

    Sentinel answers ``SENTINEL FAILOVER`` with OK and may still give up later
    (``-failover-abort-slave-timeout`` and the like): the promotion did not
    complete within ``failover-timeout``. ``master`` (its name) is still in
    place after ``attempts`` such aborts, and the group is settled around it.
    """

    def __init__(self, master: str, attempts: int) -> None:
        super().__init__(f"Sentinel aborted {attempts} failovers in a row; {master} is master")
        self.master = master
        self.attempts = attempts


@final
@dataclass
class LocalSentinelGroup:
    """A running Sentinel group: ``servers`` (the master first, at start) and ``sentinels``.

    - ``service``: the name the sentinels monitor the master under
      (``Sentinel(...).master_for(service)``).
    - ``timeout``: seconds each operation may wait for its effect.

    Failure detection is fast (``down-after-milliseconds`` 1500,
    ``failover-timeout`` 3000 by default), so a failover takes a few seconds.
    One delay is Sentinel's own and deliberate: a demoted master that is still
    running stays a master for about ten seconds after the switch (Sentinel
    waits before reconfiguring it), which is the window the
    "connection stays on the demoted master" scenario needs. :meth:`settle`
    ends that window at once.
    """

    service: str
    workdir: Path
    servers: list[RedisNode] = field(default_factory=list)
    sentinels: list[RedisNode] = field(default_factory=list)
    timeout: float = 30.0
    tls: ServiceTLS | None = None
    places: Sequence[Place] = ()

    @classmethod
    def start(
        cls,
        *,
        replicas: int = 2,
        service: str = "leaseworker",
        down_after_ms: int = 1500,
        failover_timeout_ms: int = 3000,
        timeout: float = 30.0,
        tls: ServiceTLS | None = None,
        places: Sequence[Place] = (),
    ) -> Self:
        """Start the master, ``replicas`` replicas and three sentinels; wait until settled.

        Settled means: every replica replicates from the master, and every
        sentinel names that master, sees every replica and both other sentinels.
        ``tls``: every server and sentinel serves TLS only, replication and
        the sentinels' links included. ``places``: where each node runs and
        listens, the master first, then the replicas and the sentinels (a host
        of its own each, in a network namespace of ``Hosts``); all on this
        host's loopback without.
        """
        if replicas < 1:
            raise ValueError("a Sentinel group needs at least one replica to fail over to")
        if places and len(places) != 1 + replicas + SENTINELS:
            raise ValueError(f"places: one per node, {1 + replicas + SENTINELS}, not {len(places)}")
        server_bin, sentinel_bin = _binaries()
        workdir = Path(tempfile.mkdtemp(prefix="leaseworker-sentinel-"))
        group = cls(service=service, workdir=workdir, timeout=timeout, tls=tls, places=places)
        try:
            ports = distinct_free_ports(1 + replicas + SENTINELS)
            group._start_servers(server_bin, ports[: 1 + replicas])
            group._wait_replicating(group.servers[0])
            settings = (down_after_ms, failover_timeout_ms)
            for index, port in enumerate(ports[1 + replicas :]):
                group.sentinels.append(group._start_sentinel(sentinel_bin, index, port, settings))
            poll_until(group._settled, timeout=timeout, what="the sentinel group to settle")
        except BaseException:
            group.stop()
            raise
        return group

    # -- what clients and tests see

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every sentinel, for ``Sentinel(...)`` or a sentinel URL."""
        return [node.address for node in self.sentinels]

    @property
    def url(self) -> str:
        """``redis+sentinel://host:port,.../<service>``, the URL ``--redis-url`` takes for it."""
        hosts = ",".join(f"{host}:{port}" for host, port in self.sentinel_addresses)
        if self.tls is None:
            return f"redis+sentinel://{hosts}/{self.service}"
        return f"rediss+sentinel://{hosts}/{self.service}?{tls_query(self.tls)}"

    @contextlib.asynccontextmanager
    async def master_client(self, **kwargs: Any) -> AsyncIterator[Redis]:
        """Yield a Sentinel-mode client: ``Sentinel(addresses, **kwargs).master_for(service)``.

        Both the client and the sentinel connections are closed on exit (an
        unclosed one is a ``ResourceWarning``, an error in this suite).
        """
        sentinel = Sentinel(self.sentinel_addresses, **kwargs)  # type: ignore[no-untyped-call]
        client = cast(Redis, sentinel.master_for(self.service))
        try:
            yield client
        finally:
            await client.aclose()
            await sentinel.aclose()

    async def master_address(self) -> tuple[str, int]:
        """Return the master's address, once every sentinel names the same one."""
        return (await self.master()).address

    async def master(self) -> RedisNode:
        """Return the master node, once every sentinel names the same one."""
        return await in_thread(self._wait_agreed_master)

    async def roles(self) -> list[tuple[RedisNode, Role]]:
        """Return every node with the role it reports now (``paused``/``down`` if it cannot)."""
        return await in_thread(lambda: [(node, role_of(node)) for node in self._all_nodes])

    # -- failures to replay

    async def failover(self, *, attempts: int = FAILOVER_ATTEMPTS) -> RedisNode:
        """``SENTINEL FAILOVER``; return the new master once promoted and agreed on.

        The old master keeps running and, for a while, keeps acting as a master.
        Sentinel may abort a failover it accepted (the promotion did not show in
        time); then a replica that was promoted late is put back, TILT waited
        out, and the failover requested again, ``attempts`` times in all before
        :class:`FailoverAborted`.
        """
        if attempts < 1:
            raise ValueError(f"failover() needs at least one attempt, not {attempts}")
        return await in_thread(lambda: self._failover(attempts))

    async def kill_master(self) -> RedisNode:
        """SIGKILL the master; return the replica the sentinels promote in its place."""
        old = await self.master()
        self.kill(old)
        return await self.wait_for_new_master(old)

    def kill(self, node: RedisNode) -> None:
        """SIGKILL ``node`` and return at once, before the sentinels notice.

        For scenarios that act between the crash and the promotion: pause the
        replicas, write, kill the master, resume them, then
        :meth:`wait_for_new_master`, and the promoted replica lacks the write.
        """
        node.kill()

    async def wait_for_new_master(self, old: RedisNode) -> RedisNode:
        """Return the master that replaced ``old``, once every sentinel switched to it."""
        return await in_thread(lambda: self._wait_switched(old))

    def pause(self, node: RedisNode) -> None:
        """SIGSTOP ``node`` (a replica, to hold replication back); returns once stopped.

        Writes meanwhile wait in its socket buffer and are applied on
        :meth:`resume`, even if the master died meanwhile; :meth:`cut_off`
        loses them.
        """
        node.pause()

    async def cut_off(self, replica: RedisNode) -> None:
        """Pause ``replica`` and drop its link at the master: later writes never reach it.

        The way to a promoted replica that lacks a write: ``cut_off``, write,
        :meth:`kill` the master, :meth:`resume`, :meth:`wait_for_new_master`.
        """
        await in_thread(lambda: cut_off(replica, self._wait_agreed_master()))

    def resume(self, node: RedisNode) -> None:
        """SIGCONT a paused ``node``; returns once it runs (it catches up on its own)."""
        node.resume()

    async def settle(self) -> RedisNode:
        """Bring the group back to health and return its master.

        Paused nodes are continued, killed servers restarted as replicas of the
        current master, a demoted master still acting as one is made a replica
        now (instead of in Sentinel's ten seconds), and the call returns once
        the group is settled as after :meth:`start`. Scenarios call it first, so
        each starts from the same healthy topology whatever ran before.
        """
        return await in_thread(self._settle)

    def stop(self) -> None:
        """Stop every node by PID (sentinels first, so none reacts) and remove the work dir."""
        for node in [*self.sentinels, *self.servers]:
            node.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    # -- starting

    @property
    def _all_nodes(self) -> list[RedisNode]:
        return [*self.servers, *self.sentinels]

    def _start_servers(self, binary: str, ports: list[int]) -> None:
        """Start the master on ``ports[0]`` and a replica of it on each other port."""
        master = self._place(0).address, ports[0]
        for index, port in enumerate(ports):
            name = "master" if index == 0 else f"replica{index}"
            replicaof = [] if index == 0 else [f"replicaof {master[0]} {master[1]}"]
            config = self.workdir / name / "redis.conf"
            place = self._place(index)
            write_config(
                config, [*_server_config(port, config.parent, self.tls, place), *replicaof]
            )
            log = self.workdir / f"{name}.log"
            argv = [binary, str(config)]
            self.servers.append(
                RedisNode.start(name, argv, port=port, log_path=log, tls=self.tls, place=place)
            )

    def _place(self, index: int) -> Place:
        """Where node ``index`` runs (servers first, then sentinels)."""
        return self.places[index] if self.places else HERE

    def _wait_replicating(self, master: RedisNode) -> None:
        """Wait until every replica is online at the master.

        Sentinels learn the replicas from the master's ``INFO``, so they are
        started only once the master lists them all.
        """
        expected = len(self.servers) - 1

        def online() -> bool:
            info = master.info("replication")
            synced = ("state=online" in info.get(f"slave{i}", "") for i in range(expected))
            return sum(synced) == expected

        poll_until(online, timeout=self.timeout, what="the replicas to sync with the master")

    def _start_sentinel(
        self, binary: str, index: int, port: int, settings: tuple[int, int]
    ) -> RedisNode:
        """Start one sentinel monitoring the master (the first server)."""
        name = f"sentinel{index}"
        place = self._place(len(self.servers) + index)
        master = self.servers[0]
        down_after_ms, failover_timeout_ms = settings
        config = self.workdir / name / "sentinel.conf"
        write_config(
            config,
            [
                *listen_config(port, self.tls),
                f"bind {place.address}",
                f"protected-mode {protected_mode(place)}",
                "daemonize no",
                f"dir {config.parent}",
                f"sentinel monitor {self.service} {master.address[0]} {master.port} {QUORUM}",
                f"sentinel down-after-milliseconds {self.service} {down_after_ms}",
                f"sentinel failover-timeout {self.service} {failover_timeout_ms}",
                f"sentinel parallel-syncs {self.service} 1",
            ],
        )
        log = self.workdir / f"{name}.log"
        argv = [binary, str(config)]
        return RedisNode.start(name, argv, port=port, log_path=log, tls=self.tls, place=place)

    # -- observing

    def _node_at(self, port: int) -> RedisNode:
        return next(node for node in self.servers if node.port == port)

    def _agreed_master(self) -> RedisNode | None:
        """Return the server every sentinel names as master, or ``None`` while they differ."""
        named = {
            tuple(node.command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service))
            for node in self.sentinels
        }
        if len(named) != 1:
            return None
        (_host, port) = named.pop()
        return self._node_at(int(port))

    def _wait_agreed_master(self) -> RedisNode:
        found: list[RedisNode] = []

        def agreed() -> bool:
            master = self._agreed_master()
            found[:] = [] if master is None else [master]
            return bool(found)

        poll_until(agreed, timeout=self.timeout, what="the sentinels to agree on a master")
        return found[0]

    def _switched_to(self, old: RedisNode) -> RedisNode | None:
        """Return the new master once every sentinel finished switching away from ``old``.

        ``GET-MASTER-ADDR-BY-NAME`` names the promoted replica while the
        failover is still running; ``SENTINEL MASTER`` changes its address only
        when the switch is complete, so both are checked, then the node itself.
        """
        master = self._agreed_master()
        if master is None or master is old:
            return None
        for sentinel in self.sentinels:
            state = pairs(sentinel.command("SENTINEL", "MASTER", self.service))
            if state["flags"] != "master" or int(state["port"]) != master.port:
                return None
        return master if master.role()[0] == "master" else None

    def _settled(self) -> bool:
        """Whether replication and every sentinel's view match the agreed master."""
        master = self._agreed_master()
        if master is None or master.role()[0] != "master":
            return False
        replicas = {node.port for node in self.servers if node is not master}
        for node in self.servers:
            if node is not master and not follows(node, master):
                return False
        return all(self._sentinel_sees(sentinel, master, replicas) for sentinel in self.sentinels)

    def _sentinel_sees(self, sentinel: RedisNode, master: RedisNode, replicas: set[int]) -> bool:
        """Whether ``sentinel`` sees ``master`` healthy, exactly ``replicas`` and its peers."""
        state = pairs(sentinel.command("SENTINEL", "MASTER", self.service))
        if (state["flags"], int(state["port"])) != ("master", master.port):
            return False
        if int(state["num-other-sentinels"]) != len(self.sentinels) - 1:
            return False
        # Flags, not the replica's reported link: Sentinel refreshes a replica's
        # INFO only every ten seconds, and the replication itself was checked.
        known = [pairs(r) for r in sentinel.command("SENTINEL", "REPLICAS", self.service)]
        healthy = {int(r["port"]) for r in known if r["flags"] == "slave"}
        return healthy == replicas and len(known) == len(replicas)

    # -- acting

    def _failover(self, attempts: int) -> RedisNode:
        old = self._wait_agreed_master()
        for _attempt in range(attempts):
            self._wait_ready_to_fail_over()
            self._request_failover()
            new = self._wait_switched_or_aborted(old)
            if new is not None:
                return new
            self._put_back(old)
        raise FailoverAborted(old.name, attempts)

    def _request_failover(self) -> None:
        """Send ``SENTINEL FAILOVER`` to the first sentinel until it accepts it."""

        def requested() -> bool:
            try:
                self.sentinels[0].command("SENTINEL", "FAILOVER", self.service)
            except redis.ResponseError as exc:  # INPROG, NOGOODSLAVE: not ready yet, retry
                if "INPROG" in str(exc) or "NOGOODSLAVE" in str(exc):
                    return False
                raise
            return True

        poll_until(requested, timeout=self.timeout, what="a sentinel to accept SENTINEL FAILOVER")

    def _wait_ready_to_fail_over(self) -> None:
        """Wait until no sentinel is in TILT and none holds a stale role for a replica.

        A sentinel in TILT acts on nothing, a requested failover included, for
        :data:`TILT_PERIOD`. One whose last ``INFO`` of a replica still says
        ``master`` (a master demoted a moment ago; replicas' ``INFO`` is read every
        ten seconds) turns it back into a replica the moment it is promoted, and
        the failover aborts.
        """
        poll_until(
            lambda: not any(in_tilt(node) for node in self.sentinels),
            timeout=TILT_PERIOD + self.timeout,
            what="every sentinel to leave TILT",
        )
        poll_until(
            lambda: all(self._roles_current(node) for node in self.sentinels),
            timeout=self.timeout,
            what="every sentinel to see each replica report the replica role",
        )

    def _roles_current(self, sentinel: RedisNode) -> bool:
        known = sentinel.command("SENTINEL", "REPLICAS", self.service)
        return all(pairs(r)["role-reported"] == "slave" for r in known)

    def _wait_switched_or_aborted(self, old: RedisNode) -> RedisNode | None:
        """Return the new master, or ``None`` once the first sentinel aborted the failover.

        Aborted: its ``SENTINEL MASTER`` lost ``failover_in_progress`` and still
        names ``old`` (on success the flag goes with the address change, in one step).
        """
        found: list[RedisNode | None] = []

        def decided() -> bool:
            state = pairs(self.sentinels[0].command("SENTINEL", "MASTER", self.service))
            if "failover_in_progress" not in state["flags"] and int(state["port"]) == old.port:
                found[:] = [None]
                return True
            master = self._switched_to(old)
            found[:] = [] if master is None else [master]
            return bool(found)

        poll_until(decided, timeout=self.timeout, what=f"a new master in place of {old.name}")
        return found[0]

    def _put_back(self, master: RedisNode) -> None:
        """Demote any other server acting as a master (promoted late), wait until settled."""
        self._demote_others(master)
        poll_until(self._settled, timeout=self.timeout, what="the sentinel group to settle")

    def _demote_others(self, master: RedisNode) -> None:
        """Make every running server but ``master`` that acts as a master a replica of it."""
        for node in self.servers:
            if node is master or not node.alive or node.paused:
                continue
            if node.role()[0] == "master":
                node.command("REPLICAOF", master.address[0], master.port)

    def _wait_switched(self, old: RedisNode) -> RedisNode:
        found: list[RedisNode] = []

        def switched() -> bool:
            master = self._switched_to(old)
            found[:] = [] if master is None else [master]
            return bool(found)

        poll_until(switched, timeout=self.timeout, what=f"a new master in place of {old.name}")
        return found[0]

    def _settle(self) -> RedisNode:
        for node in self._all_nodes:
            if node.paused:
                node.resume()
        master = self._wait_agreed_master()
        for node in self.servers:
            if node is not master and not node.alive:
                node.restart(["--replicaof", master.address[0], str(master.port)])
        self._put_back(master)  # demoted, not yet reconfigured by Sentinel
        return master


def _server_config(port: int, directory: Path, tls: ServiceTLS | None, place: Place) -> list[str]:
    """Return the settings of every server: its place's address, no persistence, no sync delay."""
    return [
        *listen_config(port, tls),
        f"bind {place.address}",
        f"protected-mode {protected_mode(place)}",
        "daemonize no",
        f"dir {directory}",
        'save ""',
        "appendonly no",
        "repl-diskless-sync yes",
        "repl-diskless-sync-delay 0",  # default 5 s: every (re)sync after a failover would wait
    ]


def _binaries() -> tuple[str, str]:
    """Paths of ``redis-server`` and ``redis-sentinel``, or a message naming the fix."""
    server, sentinel = installed(
        "redis-server",
        "redis-sentinel",
        hint="it installs Debian's redis-server and redis-sentinel packages",
    )
    return server, sentinel
