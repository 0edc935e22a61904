"""A private single-node Apache Kafka broker (KRaft) on free loopback ports.

The broker comes as jars from Maven Central (``deploy/local/kafka/pom.xml``,
shipped in the wheel too, cached outside the clone), runs in combined mode,
and :meth:`LocalKafka.start` returns once the group coordinator answers;
topics are never auto-created (unless the broker settings given to
:meth:`LocalKafka.start` say so). Version, start-up and JVM choices: see
docs/design.md#local-kafka.
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import hashlib
import os
import re
import shutil
import signal
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Coroutine, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self, TypeVar

from aiokafka.admin import AIOKafkaAdminClient  # type: ignore[import-untyped]
from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

from ..._kafka import create_topics
from ._proc import LOOPBACK, LocalProcess, cache_dir, free_port, run_captured, wait_for_port
from ._shipped import ToolMissingError, shipped

_T = TypeVar("_T")

POM = "deploy/local/kafka/pom.xml"
"""The Maven pom that lists the broker's jars (in a clone, and shipped in the wheel)."""

NODE_ID = 1
"""The id of the one node, which is both broker and controller."""

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

JVM_OPTIONS: tuple[str, ...] = (
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
"""JVM flags for the broker: small heap, fast start-up (see the module docstring)."""

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

_MARKER = ".complete"
_POM_NS = "{http://maven.apache.org/POM/4.0.0}"


def kafka_version(pom: Path | None = None) -> str:
    """Return ``kafka.version`` from the pom's ``<properties>`` (default: the shipped pom)."""
    pom = pom or shipped(POM)
    properties = ET.parse(pom).getroot().find(f"{_POM_NS}properties")
    if properties is not None:
        for prop in properties:
            if prop.tag == f"{_POM_NS}kafka.version" and prop.text:
                return prop.text.strip()
    raise RuntimeError(f"{pom} has no <properties><kafka.version>")


def ensure_installed(pom: Path | None = None) -> Path:
    """Fetch the broker's jars into the cache once; return the ``libs`` directory.

    A marker file holding the pom's SHA-256 is written after a successful copy,
    so a later call returns at once, and an edited pom (a new version or another
    dependency) fetches again. Concurrent callers (parallel test sessions) are
    serialised with a lock file; Maven writes into a fresh directory that is
    renamed into place only when complete, so a failed or killed download never
    leaves a half-filled ``libs``.
    """
    pom = pom or shipped(POM)
    version = kafka_version(pom)
    home = cache_dir(f"kafka-{version}")
    libs = home / "libs"
    marker = home / _MARKER
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()
    if _is_complete(marker, digest, libs, version):
        return libs
    with (home / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_complete(marker, digest, libs, version):
            return libs
        _fetch(pom, home, libs, version)
        marker.write_text(digest + "\n")
    return libs


def _is_complete(marker: Path, digest: str, libs: Path, version: str) -> bool:
    """Tell whether ``libs`` holds a finished copy made from this very pom."""
    try:
        recorded = marker.read_text().strip()
    except OSError:
        return False
    return recorded == digest and (libs / f"kafka_2.13-{version}.jar").is_file()


def _fetch(pom: Path, home: Path, libs: Path, version: str) -> None:
    """Run Maven to copy the runtime jars into ``libs``, replacing what was there."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ToolMissingError(
            f"Kafka {version} jars are not cached in {home} and Maven (mvn) is not "
            "installed to fetch them; install Maven (Debian: apt-get install maven)"
        )
    staging = Path(tempfile.mkdtemp(prefix="libs-", dir=home))
    staging.chmod(0o755)  # mkdtemp makes it private; the jars are nothing secret
    # Maven runs on a copy in the cache: an installed package may be read-only.
    shutil.copyfile(pom, home / "pom.xml")
    argv = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(home / "pom.xml"),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={staging}",
    ]
    try:
        result = run_captured(argv, cwd=home, timeout=1800)
        if result.returncode != 0:
            tail = "\n".join(result.stdout.decode(errors="replace").splitlines()[-40:])
            raise RuntimeError(
                f"fetching Kafka {version} jars with Maven failed "
                f"(exit {result.returncode}):\n{tail}"
            )
        if not (staging / f"kafka_2.13-{version}.jar").is_file():
            raise RuntimeError(f"Maven finished but {staging} has no kafka_2.13-{version}.jar")
        shutil.rmtree(libs, ignore_errors=True)
        staging.rename(libs)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def find_java() -> str:
    """Return the ``java`` launcher: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(Path(java_home, "bin", "java"), os.X_OK):
        return str(Path(java_home, "bin", "java"))
    java = shutil.which("java")
    if java is None:
        raise ToolMissingError(
            "java not found (neither $JAVA_HOME/bin/java nor on PATH); the local Kafka "
            "broker needs Java 17 or newer (Debian: apt-get install openjdk-17-jre-headless)"
        )
    return java


def random_cluster_id() -> str:
    """Return a new Kafka cluster id, as ``kafka-storage random-uuid`` makes them.

    That is a random UUID in URL-safe base64 without padding (22 characters);
    like Kafka, ids starting with ``-`` are avoided because command-line parsers
    take them for options. Generating it here saves one JVM launch.
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


@dataclass
class LocalKafka:
    """A running single-node KRaft Kafka broker, stopped by PID with :meth:`stop`.

    The work directory holds ``server.properties``, ``log4j2.properties``, the
    broker's log ``kafka.log`` and its data in ``data/``.
    """

    port: int
    controller_port: int
    workdir: Path
    process: LocalProcess
    cluster_id: str
    _remove_workdir: bool = field(default=False, repr=False)
    _cds_recording: Path | None = field(default=None, repr=False)

    @property
    def bootstrap_servers(self) -> str:
        """The ``host:port`` that Kafka clients bootstrap from."""
        return f"{LOOPBACK}:{self.port}"

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
    ) -> Self:
        """Format a fresh broker, start it, and wait until it serves Kafka requests.

        ``settings`` override :data:`BROKER_SETTINGS` (``{"auto.create.topics.enable":
        "true"}`` for a broker that creates topics on first use).

        ``workdir`` must not hold a ``data`` directory yet. Without it a temporary
        directory is used and removed again by :meth:`stop`. Raises
        ``RuntimeError`` when java is missing, the format fails, the broker
        exits, or it is not ready within ``timeout`` seconds; for the last two
        the message carries the first errors and the last lines of its log.
        """
        java = find_java()
        libs = ensure_installed()
        remove = workdir is None
        if workdir is None:
            workdir = Path(tempfile.mkdtemp(prefix="leaseworker-kafka-"))
        workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        controller_port = free_port()
        while controller_port == port:
            controller_port = free_port()
        cluster_id = random_cluster_id()
        try:
            properties = _write_config(workdir, port, controller_port, settings or {})
            archive = _cds_archive(java, libs)
            use_archive = archive if archive.is_file() else None
            _format(java, libs, workdir, properties, cluster_id, use_archive, timeout=timeout)
            recording = (
                None if use_archive else archive.with_name(f"{archive.name}.{uuid.uuid4().hex}")
            )
            process = _spawn(java, libs, workdir, properties, use_archive, recording)
        except BaseException:
            if remove:
                shutil.rmtree(workdir, ignore_errors=True)
            raise
        kafka = cls(
            port=port,
            controller_port=controller_port,
            workdir=workdir,
            process=process,
            cluster_id=cluster_id,
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

    def up(self, *, timeout: float = 60.0) -> None:
        """Start a broker stopped by :meth:`down` again; return once it serves requests."""
        if self.process.popen.poll() is None:
            return
        java, libs = find_java(), ensure_installed()
        archive = _cds_archive(java, libs)
        properties = self.workdir / "server.properties"
        use_archive = archive if archive.is_file() else None
        self.process = _spawn(java, libs, self.workdir, properties, use_archive, None)
        try:
            self._wait_ready(timeout=timeout)
        except Exception as exc:
            raise RuntimeError(
                f"Kafka broker did not come back: {exc}\n{_failure_report(self.process)}"
            ) from exc

    def _stop(self, *, timeout: float, keep_archive: bool, remove_workdir: bool) -> None:
        """Stop the process, then keep or drop a class-data archive it recorded."""
        recording = self._cds_recording
        self.process.stop(timeout if recording is None else timeout + 30.0)
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

    def _wait_ready(self, *, timeout: float) -> None:
        """Block until the broker answers metadata and group-coordinator requests.

        An open port is not enough: the broker accepts connections before it has
        registered with the controller, and the group coordinator needs the
        ``__consumer_offsets`` topic, created on first use.
        """
        deadline = time.monotonic() + timeout
        wait_for_port(self.port, timeout=timeout, process=self.process.popen)
        _run_in_thread(lambda: _probe(self.bootstrap_servers, self.process, deadline))


def _write_config(
    workdir: Path, port: int, controller_port: int, overrides: Mapping[str, str]
) -> Path:
    """Write ``server.properties`` and ``log4j2.properties``; return the former."""
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(NODE_ID),
        "listeners": f"PLAINTEXT://{LOOPBACK}:{port},CONTROLLER://{LOOPBACK}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "controller.quorum.bootstrap.servers": f"{LOOPBACK}:{controller_port}",
        "log.dirs": str(workdir / "data"),
        **BROKER_SETTINGS,
        **overrides,
    }
    properties = workdir / "server.properties"
    lines = ["# Written by leaseworker._dev._services.LocalKafka for a throwaway test broker."]
    lines += [f"{key}={value}" for key, value in settings.items()]
    properties.write_text("\n".join(lines) + "\n")
    (workdir / "log4j2.properties").write_text(_LOG4J2_PROPERTIES)
    return properties


def _cds_archive(java: str, libs: Path) -> Path:
    """Return where the AppCDS archive for this JVM build and jar set lives.

    A dynamic class-data archive only works with the JDK build and the exact
    class path it was recorded with (the JVM checks each jar's size and mtime),
    so its name hashes the resolved ``java`` binary and every jar by path, size
    and mtime, plus the JVM flags: a re-fetched ``libs`` or an upgraded JDK gets
    a new archive instead of one the JVM would silently ignore. The file may
    not exist yet.
    """
    entries = [Path(java).resolve(), *sorted(libs.iterdir())]
    stamps = [f"{path}|{path.stat().st_size}|{path.stat().st_mtime_ns}" for path in entries]
    key = "\n".join([*stamps, *JVM_OPTIONS])
    return libs.parent / f"classes-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


def _java_argv(
    java: str, libs: Path, workdir: Path, archive: Path | None, recording: Path | None = None
) -> list[str]:
    """Return ``java`` with the JVM flags, class-data archive, logging config and classpath."""
    cds: list[str] = []
    if archive is not None:
        cds.append(f"-XX:SharedArchiveFile={archive}")
    if recording is not None:
        cds.append(f"-XX:ArchiveClassesAtExit={recording}")
    return [
        java,
        *JVM_OPTIONS,
        *cds,
        f"-Dlog4j2.configurationFile={workdir / 'log4j2.properties'}",
        "-cp",
        f"{libs}/*",
    ]


def _format(
    java: str,
    libs: Path,
    workdir: Path,
    properties: Path,
    cluster_id: str,
    archive: Path | None,
    *,
    timeout: float,
) -> None:
    """Format the storage as a single-node dynamic quorum; raise with output on failure."""
    argv = [
        *_java_argv(java, libs, workdir, archive),
        "kafka.tools.StorageTool",
        "format",
        "--cluster-id",
        cluster_id,
        "--config",
        str(properties),
        "--standalone",
    ]
    result = run_captured(argv, cwd=workdir, timeout=timeout)
    if result.returncode != 0:
        output = "\n".join(result.stdout.decode(errors="replace").splitlines()[-40:])
        raise RuntimeError(
            f"formatting Kafka storage failed with exit code {result.returncode}:\n{output}"
        )


def _spawn(
    java: str,
    libs: Path,
    workdir: Path,
    properties: Path,
    archive: Path | None,
    recording: Path | None,
) -> LocalProcess:
    """Start ``kafka.Kafka`` in the foreground, logging to ``kafka.log``.

    With ``recording`` the JVM writes a class-data archive there when it exits.
    """
    argv = [*_java_argv(java, libs, workdir, archive, recording), "kafka.Kafka", str(properties)]
    return LocalProcess.spawn("kafka", argv, log_path=workdir / "kafka.log")


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


async def _probe(bootstrap: str, process: LocalProcess, deadline: float) -> None:
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
                if NODE_ID in brokers:
                    await admin.find_coordinator("leaseworker-readiness-probe")
                    return
                last = LookupError(f"metadata lists brokers {sorted(brokers)}")
        except (KafkaError, OSError, TimeoutError) as exc:
            last = exc
        finally:
            await admin.close()
        await asyncio.sleep(0.1)


if __name__ == "__main__":
    # ``python -m leaseworker._dev._services._kafka``: fetch the jars (for bootstrap scripts).
    print(ensure_installed())
