"""A private single-node Apache Kafka broker (KRaft) on free loopback ports.

The broker comes as jars from Maven Central (``_kafka_install``), runs in
combined mode, and :meth:`LocalKafka.start` returns once the group
coordinator answers; topics are never auto-created (unless the broker
settings given to :meth:`LocalKafka.start` say so). With a
``BrokerSecurity`` (``_kafka_secure``) it also opens SSL and SASL_SSL
listeners and may enforce ACLs (``_kafka_acls``). Version, start-up and JVM
choices: see docs/design.md#development-services. With a :class:`Quorum` it
is one node of a multi-node cluster (``_kafka_cluster``).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self, TypeVar

from aiokafka.admin import AIOKafkaAdminClient  # type: ignore[import-untyped]
from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

from leaseworker.toolkit import create_topics

from ._kafka_acls import Acl, create_acls
from ._kafka_install import (
    JVM_OPTIONS,
    POM,
    _cds_archive,
    _format,
    _spawn,
    ensure_installed,
    find_java,
    kafka_version,
    random_cluster_id,
)
from ._kafka_scram import set_scram_password
from ._kafka_secure import BrokerSecurity, broker_settings, scram_format_args
from ._proc import HERE, LocalProcess, Place, distinct_free_ports, service_workdir, wait_for_port

__all__ = [
    "BROKER_SETTINGS",
    "JVM_OPTIONS",
    "NODE_ID",
    "POM",
    "BrokerSecurity",
    "LocalKafka",
    "Quorum",
    "ensure_installed",
    "find_java",
    "kafka_version",
    "random_cluster_id",
]

_T = TypeVar("_T")

NODE_ID = 1
"""The id of a single node, which is both broker and controller."""


@dataclass(frozen=True)
class Quorum:
    """One node's part in a static KRaft quorum of combined broker+controller nodes.

    ``voters`` maps every node id to its controller port; ``addresses`` maps
    node ids to the addresses their ``Place`` listens at (hosts of their own),
    and a node not in it listens where this one does. ``port``: this node's
    client port.
    """

    cluster_id: str
    voters: Mapping[int, int]
    node_id: int
    port: int
    addresses: Mapping[int, str] = field(default_factory=dict)

    def voter_endpoints(self, here: str) -> dict[int, tuple[str, int]]:
        """Every voter's controller ``(address, port)``; ``here``: this node's address."""
        return {i: (self.addresses.get(i, here), p) for i, p in self.voters.items()}


BROKER_SETTINGS: dict[str, str] = {
    # One node holds every replica, so every replication factor and min ISR is 1.
    "num.partitions": "1",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    # Internal topics default to 50 partitions each; one is plenty here and makes
    # the group coordinator ready in a fraction of the time.
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.num.partitions": "1",
    # Join a new consumer group at once instead of waiting 3 s for more members.
    "group.initial.rebalance.delay.ms": "0",
    # Let failover tests use short consumer session timeouts (default minimum 6 s).
    "group.min.session.timeout.ms": "500",
    # See the module docstring: topics are created explicitly.
    "auto.create.topics.enable": "false",
    "delete.topic.enable": "true",
    # Fewer threads than the defaults (3 network, 8 I/O): a test broker is idle
    # most of the time and CI machines have few cores.
    "num.network.threads": "2",
    "num.io.threads": "2",
}

_LOG4J2_PROPERTIES = """\
# Written by leaseworker: the broker logs to stdout, which LocalProcess appends
# to kafka.log in the work directory.
status = warn
# Kafka stops itself on SIGTERM; log4j's own hook would stop logging first.
shutdownHook = disable
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
# Each config object dumps all of its several hundred values at INFO.
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
"""


@dataclass
class LocalKafka:
    """A running single-node KRaft Kafka broker, stopped by PID with :meth:`stop`.

    The work directory holds ``server.properties``, ``log4j2.properties``, the
    broker's log ``kafka.log`` and its data in ``data/``. ``listener_ports``
    maps the secured listeners' names (``SSL``, ``SASL_SSL``, ...) to their
    ports; empty without a ``BrokerSecurity``.
    """

    port: int
    controller_port: int
    workdir: Path
    process: LocalProcess
    cluster_id: str
    listener_ports: Mapping[str, int] = field(default_factory=dict)
    place: Place = HERE
    node_id: int = NODE_ID
    _remove_workdir: bool = field(default=False, repr=False)
    _cds_recording: Path | None = field(default=None, repr=False)

    @property
    def bootstrap_servers(self) -> str:
        """The ``host:port`` that Kafka clients bootstrap from."""
        return f"{self.place.address}:{self.port}"

    def address(self, listener: str) -> str:
        """Return the ``host:port`` of a secured listener (``SSL``, ``SASL_SSL``, ...)."""
        try:
            return f"{self.place.address}:{self.listener_ports[listener]}"
        except KeyError:
            raise KeyError(f"this broker has no {listener} listener") from None

    @staticmethod
    def ensure_installed() -> Path:
        """Fetch the broker's jars if not cached yet (no broker is started).

        Returns the directory of jars. Meant for a bootstrap step, so that the
        first test run does not spend its time in Maven; see
        :func:`ensure_installed`.
        """
        return ensure_installed()

    @classmethod
    def start(
        cls,
        *,
        workdir: Path | None = None,
        timeout: float = 60.0,
        settings: Mapping[str, str] | None = None,
        security: BrokerSecurity | None = None,
        place: Place = HERE,
        quorum: Quorum | None = None,
    ) -> Self:
        """Format a fresh broker, start it, and wait until it serves Kafka requests.

        ``settings`` override :data:`BROKER_SETTINGS` (``{"auto.create.topics.enable":
        "true"}`` for a broker that creates topics on first use). ``security``
        adds the secured listeners, SASL users and authorizer (``_kafka_secure``).
        ``place``: run and listen there (a network namespace of ``Hosts``).
        ``quorum``: be that node of a multi-node cluster (its ports and cluster
        id); the call returns once enough of its peers run too.

        ``workdir`` must not hold a ``data`` directory yet. Without it a temporary
        directory is used and removed again by :meth:`stop`. Raises
        ``RuntimeError`` when java is missing, the format fails, the broker
        exits, or it is not ready within ``timeout`` seconds; for the last two
        the message carries the first errors and the last lines of its log.
        """
        java = find_java()
        libs = ensure_installed()
        listeners = security.listeners if security else ()
        if quorum is None:
            port, controller_port, *secured = distinct_free_ports(2 + len(listeners))
            cluster_id, node_id = random_cluster_id(), NODE_ID
        else:
            port, controller_port = quorum.port, quorum.voters[quorum.node_id]
            cluster_id, node_id = quorum.cluster_id, quorum.node_id
            secured = distinct_free_ports(len(listeners)) if listeners else []
        listener_ports = dict(zip(listeners, secured, strict=True))
        with service_workdir(workdir, "kafka") as (workdir, remove):
            properties = _write_config(
                workdir,
                (place.address, port, controller_port),
                settings or {},
                security,
                listener_ports,
                node_id=node_id,
                voters=(
                    quorum.voter_endpoints(place.address)
                    if quorum
                    else {node_id: (place.address, controller_port)}
                ),
            )
            archive = _cds_archive(java, libs)
            use_archive = archive if archive.is_file() else None
            _format(
                java,
                libs,
                workdir,
                properties,
                cluster_id,
                use_archive,
                scram_format_args(security),
                node_id=node_id,
                timeout=timeout,
            )
            recording = (
                None if use_archive else archive.with_name(f"{archive.name}.{uuid.uuid4().hex}")
            )
            process = _spawn(java, libs, workdir, properties, use_archive, recording, place)
        kafka = cls(
            port=port,
            controller_port=controller_port,
            workdir=workdir,
            process=process,
            cluster_id=cluster_id,
            listener_ports=listener_ports,
            place=place,
            node_id=node_id,
            _remove_workdir=remove,
            _cds_recording=recording,
        )
        try:
            kafka._wait_ready(timeout=timeout)
        except Exception as exc:
            kafka._stop(timeout=15.0, keep_archive=False, remove_workdir=False)
            report = _failure_report(kafka.process)
            if remove:
                shutil.rmtree(workdir, ignore_errors=True)
            raise RuntimeError(f"Kafka broker did not become ready: {exc}\n{report}") from exc
        except BaseException:
            kafka._stop(timeout=15.0, keep_archive=False, remove_workdir=remove)
            raise
        return kafka

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the broker by PID and remove a temporary work directory.

        SIGTERM makes Kafka shut down in order (well under a second for an idle
        single node); SIGKILL follows after ``timeout``. A broker that records
        the class-data archive gets 30 s more, as writing it takes a few
        seconds. Safe to call twice.
        """
        self._stop(timeout=timeout, keep_archive=True, remove_workdir=self._remove_workdir)

    def restart(self, *, down_for: float = 0.0, timeout: float = 60.0) -> None:
        """Stop the broker and start it again on the same ports with the same data.

        Topics, records and committed offsets are on disk and survive; clients
        see the broker go away at their address and come back. ``down_for``
        seconds pass between the stop and the new start, which returns once
        the broker serves requests again (see :meth:`start` for the errors).
        """
        self.down()
        time.sleep(down_for)
        self.up(timeout=timeout)

    def down(self, timeout: float = 15.0) -> None:
        """Stop the broker by PID, keeping its ports, data and work directory for :meth:`up`.

        An outage as clients see it: the address refuses connections until
        :meth:`up`. Safe to call on a broker that is already down.
        """
        self._stop(timeout=timeout, keep_archive=True, remove_workdir=False)

    def kill(self) -> None:
        """SIGKILL the broker (no orderly shutdown), keeping its data for :meth:`up`."""
        self._stop(timeout=0.0, keep_archive=False, remove_workdir=False, signals=())

    def up(self, *, timeout: float = 60.0) -> None:
        """Start a broker stopped by :meth:`down` again; return once it serves requests."""
        if self.process.popen.poll() is None:
            return
        java, libs = find_java(), ensure_installed()
        archive = _cds_archive(java, libs)
        properties = self.workdir / "server.properties"
        use_archive = archive if archive.is_file() else None
        self.process = _spawn(java, libs, self.workdir, properties, use_archive, None, self.place)
        try:
            self._wait_ready(timeout=timeout)
        except Exception as exc:
            raise RuntimeError(
                f"Kafka broker did not come back: {exc}\n{_failure_report(self.process)}"
            ) from exc

    def _stop(
        self,
        *,
        timeout: float,
        keep_archive: bool,
        remove_workdir: bool,
        signals: tuple[signal.Signals, ...] = (signal.SIGTERM,),
    ) -> None:
        """Stop the process, then keep or drop a class-data archive it recorded."""
        recording = self._cds_recording
        self.process.stop(timeout if recording is None else timeout + 30.0, signals=signals)
        if recording is not None:
            self._cds_recording = None
            killed = self.process.popen.returncode == -signal.SIGKILL
            if keep_archive and not killed and recording.is_file() and recording.stat().st_size:
                # The name without the random suffix; atomic, so a concurrent
                # start maps either no archive or a complete one.
                archive = recording.with_suffix("")
                recording.replace(archive)
                # Archives for older jars or JDKs are never used again. Unlinking
                # one that a running JVM has mapped is harmless on Linux.
                for stale in archive.parent.glob("classes-*.jsa"):
                    if stale != archive:
                        stale.unlink(missing_ok=True)
            else:
                recording.unlink(missing_ok=True)
        if remove_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def create_topics(
        self,
        names: Iterable[str],
        *,
        partitions: int = 1,
        replication_factor: int = 1,
        exist_ok: bool = False,
        timeout: float = 30.0,
        configs: Mapping[str, str] | None = None,
    ) -> None:
        """Create topics and wait until every partition has a leader.

        ``configs``: topic-level settings of every topic created (for example
        ``{"max.message.bytes": "2048"}``).

        Waiting for leaders means a producer started right after this never sees
        a transient ``LEADER_NOT_AVAILABLE``. Raises the matching aiokafka error
        (for example ``TopicAlreadyExistsError`` unless ``exist_ok``) when the
        broker refuses a topic. Usable from sync code and from inside a running
        event loop (it runs its own loop in a worker thread).
        """
        topics = list(names)
        _run_in_thread(
            lambda: create_topics(
                self.bootstrap_servers,
                topics,
                partitions=partitions,
                replication_factor=replication_factor,
                exist_ok=exist_ok,
                configs=configs,
                within=timeout,
            )
        )

    def grant(self, acls: Sequence[Acl], *, timeout: float = 30.0) -> None:
        """Create ACLs (see ``_kafka_acls.pod_acls``) and wait until the broker applies them.

        Only meaningful on a broker started with ``BrokerSecurity(authorizer=True)``.
        """
        _run_in_thread(lambda: create_acls(self.bootstrap_servers, list(acls), within=timeout))

    def set_scram_password(self, user: str, password: str, *, timeout: float = 30.0) -> None:
        """Replace ``user``'s SCRAM credentials (each mechanism's) by ``password``.

        Logins from now on need the new password; connections already authenticated stay.
        """
        _run_in_thread(
            lambda: set_scram_password(self.bootstrap_servers, user, password, within=timeout)
        )

    def _wait_ready(self, *, timeout: float) -> None:
        """Block until the broker answers metadata and group-coordinator requests.

        An open port is not enough: the broker accepts connections before it has
        registered with the controller, and the group coordinator needs the
        ``__consumer_offsets`` topic, created on first use.
        """
        deadline = time.monotonic() + timeout
        wait_for_port(
            self.port, timeout=timeout, process=self.process.popen, host=self.place.address
        )
        _run_in_thread(lambda: _probe(self.bootstrap_servers, self.process, deadline, self.node_id))


def _write_config(
    workdir: Path,
    listen: tuple[str, int, int],
    overrides: Mapping[str, str],
    security: BrokerSecurity | None = None,
    listener_ports: Mapping[str, int] | None = None,
    *,
    node_id: int = NODE_ID,
    voters: Mapping[int, tuple[str, int]],
) -> Path:
    """Write ``server.properties`` and ``log4j2.properties``; return the former.

    ``listen``: the address, the client port and the controller port.
    ``voters``: the static quorum's controller addresses and ports by node id
    (a single node's is itself).
    """
    host, port, controller_port = listen
    secured = dict(listener_ports or {})
    advertised = [f"PLAINTEXT://{host}:{port}"]
    advertised += [f"{name}://{host}:{p}" for name, p in secured.items()]
    protocols = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
    if security is not None:
        protocols += [f"{name}:{security.protocol(name)}" for name in secured]
    quorum = {"controller.quorum.voters": ",".join(f"{i}@{a}:{p}" for i, (a, p) in voters.items())}
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "listeners": ",".join([*advertised, f"CONTROLLER://{host}:{controller_port}"]),
        "advertised.listeners": ",".join(advertised),
        "listener.security.protocol.map": ",".join(protocols),
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        **quorum,
        "log.dirs": str(workdir / "data"),
        **BROKER_SETTINGS,
        **(broker_settings(security) if security is not None else {}),
        **overrides,
    }
    properties = workdir / "server.properties"
    lines = ["# Written by leaseworker_dev._services.LocalKafka for a throwaway test broker."]
    lines += [f"{key}={value}" for key, value in settings.items()]
    properties.write_text("\n".join(lines) + "\n")
    (workdir / "log4j2.properties").write_text(_LOG4J2_PROPERTIES)
    return properties


_ERROR_LINE = re.compile(r"^\[[^\]]*\] (?:ERROR|FATAL) |^Caused by: ")


def _failure_report(process: LocalProcess) -> str:
    """Return the broker log's first error lines and its last lines, for exceptions.

    The tail alone is not enough: a broker that fails (say, a port in use) logs
    the cause and then a few hundred lines of orderly shutdown.
    """
    try:
        lines = process.log_path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {process.log_path})"
    errors = [line for line in lines if _ERROR_LINE.search(line)][:12]
    parts = []
    if errors:
        parts += ["first errors in the broker log:", *errors, ""]
    parts += ["last lines of the broker log:", *lines[-25:]]
    return "\n".join(parts)


def _run_in_thread(factory: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """Run a coroutine on a private event loop in a worker thread; return its result.

    ``asyncio.run`` refuses to run inside a running loop, and :meth:`LocalKafka.start`
    is called both from sync fixtures and from async tests or the demo. A fresh
    thread works in both cases; the coroutine is created inside it, so nothing
    is left un-awaited if the thread cannot start.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="leaseworker-kafka") as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()


async def _probe(
    bootstrap: str, process: LocalProcess, deadline: float, node_id: int = NODE_ID
) -> None:
    """Retry metadata and FindCoordinator until both succeed, the broker exits, or timeout."""
    last: BaseException | None = None
    while True:
        if process.popen.poll() is not None:
            raise RuntimeError(f"broker process exited with {process.popen.returncode}")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"broker not ready in time (last error: {last!r})")
        admin = AIOKafkaAdminClient(
            bootstrap_servers=bootstrap, request_timeout_ms=5000, retry_backoff_ms=50
        )
        try:
            async with asyncio.timeout(min(remaining, 10.0)):
                await admin.start()
                cluster = await admin.describe_cluster()
                brokers = {broker["node_id"] for broker in cluster["brokers"]}
                if node_id in brokers:
                    await admin.find_coordinator("leaseworker-readiness-probe")
                    return
                last = LookupError(f"metadata lists brokers {sorted(brokers)}")
        except (KafkaError, OSError, TimeoutError) as exc:
            last = exc
        finally:
            await admin.close()
        await asyncio.sleep(0.1)


if __name__ == "__main__":
    # ``python -m leaseworker_dev._services._kafka``: fetch the jars (for bootstrap scripts).
    print(ensure_installed())
