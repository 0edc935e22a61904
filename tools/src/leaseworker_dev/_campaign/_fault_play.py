"""Playing a planned fault: inject it, hold it for its duration, heal it, record it.

Each kind is one small coroutine; every one records a :class:`FaultWindow` with its
start and end on the monotonic clock the pods' recorders use. What each
models in production: see docs/chaos.md#the-faults.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
from aiokafka.admin import AIOKafkaAdminClient  # type: ignore[import-untyped]
from aiokafka.admin.config_resource import (  # type: ignore[import-untyped]
    ConfigResource,
    ConfigResourceType,
)

from leaseworker.toolkit import FaultWindow, Scalar, config_setting

from .._services import Drops, FailoverAborted, Host, Hosts, PodProcess
from ._outbox_audit import lapse_claims
from ._plan import PlannedFault
from ._promotion import promote
from ._receiver import Receiver
from ._stall import stall_request
from ._testbed import REDIS_TIMEOUT, Services

_MAX_BYTES = "max.message.bytes"


@dataclass
class Injector:
    """Plays faults against the services and pods; ``faults`` is what was played."""

    stack: Services
    pods: dict[str, PodProcess]
    lease: float
    receiver: Receiver | None = None  # knows the effects topics
    faults: list[FaultWindow] = field(default_factory=list)
    skipped: list[PlannedFault] = field(default_factory=list)
    _lanes: dict[str, anyio.Lock] = field(default_factory=dict)

    async def play(self, planned: PlannedFault) -> None:
        """Inject ``planned``, wait its duration, heal it (its kind's coroutine).

        One fault per pod, and one on the shared services, at a time: the
        plan spaces them, and a fault that runs long (a broker slow to come
        back) holds the next one of its lane until it is healed.
        """
        handler: Callable[[PlannedFault], Awaitable[None]] = getattr(self, f"_{planned.kind}")
        lane = self._lanes.setdefault(planned.target or "shared", anyio.Lock())
        async with lane:
            await handler(planned)

    def _record(
        self, planned: PlannedFault, start: float, end: float | None = None, **attrs: Scalar
    ) -> None:
        self.faults.append(
            FaultWindow(
                kind=planned.kind,
                start=start,
                end=time.monotonic() if end is None else end,
                target=planned.target,
                attrs=attrs,
            )
        )

    def _pod(self, planned: PlannedFault) -> PodProcess:
        assert planned.target is not None
        return self.pods[planned.target]

    async def _redis_blackhole(self, planned: PlannedFault) -> None:
        proxy = self._pod(planned).proxy
        assert proxy is not None
        start = time.monotonic()
        proxy.blackhole = True
        await anyio.sleep(planned.duration)
        proxy.blackhole = False
        proxy.cut()  # connections that lost bytes are out of step: drop them
        self._record(planned, start)

    async def _redis_delay(self, planned: PlannedFault) -> None:
        proxy = self._pod(planned).proxy
        assert proxy is not None
        start = time.monotonic()
        proxy.reply_delay = planned.size
        await anyio.sleep(planned.duration)
        proxy.reply_delay = 0.0
        self._record(planned, start, delay_ms=round(planned.size * 1000))

    async def _redis_cut(self, planned: PlannedFault) -> None:
        proxy = self._pod(planned).proxy
        assert proxy is not None
        start = time.monotonic()
        proxy.cut()
        self._record(planned, start)
        await anyio.sleep(planned.duration)

    async def _pod_pause(self, planned: PlannedFault) -> None:
        pod = self._pod(planned)
        if not pod.running():
            self.skipped.append(planned)
            return
        start = time.monotonic()
        pod.signal(signal.SIGSTOP)
        await anyio.sleep(planned.duration)
        pod.signal(signal.SIGCONT)
        self._record(planned, start)

    async def _pod_kill(self, planned: PlannedFault) -> None:
        pod = self._pod(planned)
        if not pod.running():
            self.skipped.append(planned)
            return
        start = time.monotonic()
        code = await anyio.to_thread.run_sync(pod.kill)
        self._record(planned, start, start, exit_code=-1 if code is None else code)
        await anyio.sleep(planned.duration)
        pod.start()

    async def _loop_stall(self, planned: PlannedFault) -> None:
        """Ask the pod's next job to block its loop; the pod records the stall it played."""
        request = stall_request(self.stack.workdir, self._pod(planned).name)
        where = "end" if planned.size else "start"
        request.write_text(f"{planned.duration:.3f} {where}")
        await anyio.sleep(self.lease)  # time for a job to start on that pod and take it
        if request.exists():
            request.unlink(missing_ok=True)
            self.skipped.append(planned)  # no job started there meanwhile
        else:
            await anyio.sleep(planned.duration)

    async def _pod_cut_redis(self, planned: PlannedFault) -> None:
        """Cut the pod's host from Redis's, both ways; Kafka and the store still reachable."""
        await self._partition(planned, lambda hosts, pod: hosts.cut(pod, hosts["redis"]))

    async def _pod_isolate(self, planned: PlannedFault) -> None:
        """Cut the pod's host from every host and from the campaign, both ways."""
        await self._partition(planned, lambda hosts, pod: hosts.isolate(pod))

    async def _partition(self, planned: PlannedFault, cut: Callable[[Hosts, Host], Drops]) -> None:
        """Play ``cut`` on the pod's host for ``duration``, then mend it alone.

        Only its own drops: another pod's partition may still be on.
        """
        hosts = self.stack.hosts
        assert hosts is not None
        assert planned.target is not None
        start = time.monotonic()
        drops = cut(hosts, hosts[planned.target])
        try:
            await anyio.sleep(planned.duration)
        finally:
            hosts.mend(drops)
        self._record(planned, start)

    async def _redis_restart(self, planned: PlannedFault) -> None:
        assert self.stack.redis is not None
        start = time.monotonic()
        await anyio.to_thread.run_sync(self.stack.redis.restart_with_data)
        self._record(planned, start)
        await anyio.sleep(planned.duration)

    async def _redis_restart_empty(self, planned: PlannedFault) -> None:
        assert self.stack.redis is not None
        start = time.monotonic()
        await anyio.to_thread.run_sync(self.stack.redis.restart_empty)
        self._record(planned, start)
        await anyio.sleep(planned.duration)

    async def _redis_clock_step(self, planned: PlannedFault) -> None:
        """Step the Redis host's wall clock forward by ``size`` seconds, for good (an NTP step).

        Every lease expires at once while its holder runs on until its next
        renewal: the window carries that overlap's bound, the renewal interval
        (a third of the lease) plus the pods' Redis timeout and 0.5 s of margin.
        """
        redis = self.stack.redis
        if redis is None or redis.clock is None:  # no C compiler for the shim here
            self.skipped.append(planned)
            return
        start = time.monotonic()
        redis.clock.step(planned.size)
        bound = self.lease / 3 + REDIS_TIMEOUT + 0.5
        self._record(planned, start, step_s=round(planned.size, 3), overlap_bound_s=bound)
        await anyio.sleep(planned.duration)

    async def _kafka_restart(self, planned: PlannedFault) -> None:
        start = time.monotonic()
        kafka = self.stack.kafka
        await anyio.to_thread.run_sync(lambda: kafka.restart(down_for=planned.duration))
        self._record(planned, start)

    async def _broker_kill(self, planned: PlannedFault) -> None:
        """SIGKILL one of three brokers; start it after ``duration``, wait for its replicas.

        Its partitions' leaders, a group coordinator among them when it held
        one, move to the other two once the controllers fence it (3 s).
        """
        cluster = self.stack.kafka3
        assert cluster is not None
        node_id = sorted(cluster.nodes)[int(planned.size)]
        start = time.monotonic()
        cluster.kill(node_id)
        self._record(planned, start, start, node=node_id)
        await anyio.sleep(planned.duration)

        def back() -> None:
            cluster.up(node_id)
            cluster.wait_in_sync()

        await anyio.to_thread.run_sync(back)

    async def _broker_rolling_restart(self, planned: PlannedFault) -> None:
        """Restart each of three brokers in turn, each once the partitions are in sync."""
        cluster = self.stack.kafka3
        assert cluster is not None
        start = time.monotonic()
        await anyio.to_thread.run_sync(cluster.rolling_restart)
        self._record(planned, start)
        await anyio.sleep(planned.duration)

    async def _store_promote(self, planned: PlannedFault) -> None:
        """SIGKILL the store's primary; promote its standby after ``duration``; rejoin a new one.

        The window runs from the kill to the promotion and carries what the
        primary had committed and the promoted node lacks (``_promotion``).
        """
        pair = self.stack.postgres_pair
        assert pair is not None
        killed, promoted, loss = await anyio.to_thread.run_sync(promote, pair, planned.duration)
        self._record(planned, killed, promoted, synchronous=pair.synchronous, **loss.attrs())

    async def _sentinel_failover(self, planned: PlannedFault) -> None:
        """``SENTINEL FAILOVER``; one Sentinel aborted on every attempt is a fault not played."""
        group = self.stack.sentinel
        assert group is not None
        start = time.monotonic()
        try:
            new = await group.failover()
        except FailoverAborted:
            self.skipped.append(planned)  # the master never changed: nothing was injected
            await group.settle()
            return
        self._record(planned, start, master_port=new.port)
        await group.settle()
        await anyio.sleep(planned.duration)

    async def _store_outage(self, planned: PlannedFault) -> None:
        proxy = self.stack.store_proxy
        assert proxy is not None
        start = time.monotonic()
        proxy.blackhole = proxy.refuse = True
        await anyio.sleep(planned.duration)
        proxy.blackhole = proxy.refuse = False
        proxy.cut()
        self._record(planned, start)

    async def _cluster_failover(self, planned: PlannedFault) -> None:
        cluster = self.stack.cluster
        assert cluster is not None
        start = time.monotonic()
        new = await cluster.failover(int(planned.size))
        self._record(planned, start, shard=int(planned.size), master_port=new.port)
        await cluster.settle()
        await anyio.sleep(planned.duration)

    async def _effects_refused(self, planned: PlannedFault) -> None:
        """Make the broker refuse every record of the effects topics (spring-modulith #395).

        Their ``max.message.bytes`` drops to 1 byte, so each relay send is
        answered MESSAGE_TOO_LARGE at once until the override is removed; a
        relay must not mark those messages sent.
        """
        topics = sorted(self.receiver.topics()) if self.receiver is not None else []
        if not topics:
            self.skipped.append(planned)  # no effect published yet: nothing to refuse
            return
        bootstrap = self.stack.bootstrap_servers
        start = time.monotonic()
        await refuse_records(bootstrap, topics, refuse=True)
        try:
            await anyio.sleep(planned.duration)
        finally:
            with anyio.CancelScope(shield=True):
                await refuse_records(bootstrap, topics, refuse=False)
        self._record(planned, start, topics=len(topics))

    async def _outbox_claims_lapse(self, planned: PlannedFault) -> None:
        """Relays take over each other's claims while the first still sends (spring-modulith #1935).

        The broker is frozen (SIGSTOP, a stop-the-world pause shorter than the
        pods' session timeout), so relays hold their claims while their sends
        wait, and every claim lapses as soon as it is seen (``lapse_claims``):
        other relays claim the same messages and send them too. Then the
        broker resumes: several sends of one message land, one relay marks it,
        none may claim it again.
        """
        broker = self.stack.kafka.process.popen
        start = time.monotonic()
        broker.send_signal(signal.SIGSTOP)
        try:
            lapsed = await lapse_claims(self.stack.store_url, planned.duration, every=0.02)
        finally:
            broker.send_signal(signal.SIGCONT)
        if not lapsed:
            self.skipped.append(planned)  # no relay held a claim meanwhile
            return
        self._record(planned, start, lapsed=lapsed)

    async def _receiver_restart(self, planned: PlannedFault) -> None:
        """Kill the campaign's receiver at its next await and restart it after ``duration``.

        A batch it processed may not have its offsets committed: redelivered
        to the next consumer, which has only the inbox's database to drop it.
        """
        receiver = self.receiver
        if receiver is None:
            self.skipped.append(planned)
            return
        start = time.monotonic()
        receiver.kill()
        try:
            await anyio.sleep(planned.duration)
        finally:
            receiver.revive()
        self._record(planned, start)


async def refuse_records(bootstrap: str, topics: list[str], *, refuse: bool) -> None:
    """Set ``topics``' ``max.message.bytes`` to 1 (``refuse``) or drop their overrides.

    Returns once the broker describes every topic so: the controller answers
    AlterConfigs when the change is committed, and the broker applies it as it
    replays the metadata log, a moment later; a send in between still lands.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    with anyio.fail_after(30):
        await admin.start()
        try:
            setting = {_MAX_BYTES: "1"} if refuse else {}
            resources = [ConfigResource(ConfigResourceType.TOPIC, t, setting) for t in topics]
            for response in await admin.alter_configs(resources):
                for error, message, *_ in response.resources:
                    if error:
                        raise RuntimeError(f"max.message.bytes not set: {error} {message}")
            pending = list(topics)
            while pending:
                pending = [t for t in pending if await _refuses(admin, t) != refuse]
                if pending:
                    await anyio.sleep(0.01)  # the broker replays the change within milliseconds
        finally:
            await admin.close()


async def _refuses(admin: AIOKafkaAdminClient, topic: str) -> bool:
    """Tell whether the broker describes ``topic``'s ``max.message.bytes`` as 1."""
    resource = ConfigResource(ConfigResourceType.TOPIC, topic, {_MAX_BYTES: None})
    [response] = await admin.describe_configs([resource])
    return config_setting(response, _MAX_BYTES) == "1"
