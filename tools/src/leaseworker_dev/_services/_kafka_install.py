"""Where the local Kafka broker's jars and JVM come from, and how the JVM is launched.

The jars come from Maven Central (``deploy/local/kafka/pom.xml``, shipped in
the wheel too) into a cache outside the clone, once per pom; ``java`` is
``$JAVA_HOME``'s or the one on PATH; every launch (format, broker) shares the
JVM flags and a class-data archive that makes start-up faster. Split from
``_kafka`` (the broker itself), which re-exports these names.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import os
import shutil
import tempfile
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from ._proc import HERE, LocalProcess, Place, cache_dir, run_captured
from ._shipped import ToolMissingError, shipped

POM = "deploy/local/kafka/pom.xml"
"""The Maven pom that lists the broker's jars (in a clone, and shipped in the wheel)."""


JVM_OPTIONS: tuple[str, ...] = (
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
"""JVM flags for the broker: small heap, fast start-up (see the module docstring)."""


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


_CHECKPOINT = Path("__cluster_metadata-0", "00000000000000000000-0000000000.checkpoint")
"""The metadata log's first checkpoint, as ``format`` writes it under the data directory."""


def _format(
    java: str,
    libs: Path,
    workdir: Path,
    properties: Path,
    cluster_id: str,
    archive: Path | None,
    extra: Sequence[str] = (),
    *,
    node_id: int,
    timeout: float,
) -> None:
    """Format the storage for the static ``controller.quorum.voters`` in ``properties``.

    Raises with the tool's output on failure. ``extra``: more ``format`` arguments
    (the SCRAM users' ``--add-scram``). Without them the first format's metadata
    checkpoint is kept beside the jars and later formats copy it, writing
    ``meta.properties`` themselves: for a static quorum the checkpoint holds only
    the release's feature levels (two formats' differ in timestamps and CRCs, not
    in cluster or node id), and the tool's JVM took a second of wall time and 0.7 s
    of CPU at each broker's start. With ``extra`` the tool runs every time (the
    users' credentials are not kept).
    """
    data = workdir / "data"
    template = libs.parent / "storage-template" / _CHECKPOINT.name
    if not extra and template.is_file():
        (data / _CHECKPOINT.parent).mkdir(parents=True)
        shutil.copyfile(template, data / _CHECKPOINT)
        meta = f"node.id={node_id}\ndirectory.id={random_cluster_id()}\nversion=1\n"
        (data / "meta.properties").write_text(f"{meta}cluster.id={cluster_id}\n")
        return
    argv = [
        *_java_argv(java, libs, workdir, archive),
        "kafka.tools.StorageTool",
        "format",
        "--cluster-id",
        cluster_id,
        "--config",
        str(properties),
        *extra,
    ]
    result = run_captured(argv, cwd=workdir, timeout=timeout)
    if result.returncode != 0:
        output = "\n".join(result.stdout.decode(errors="replace").splitlines()[-40:])
        raise RuntimeError(
            f"formatting Kafka storage failed with exit code {result.returncode}:\n{output}"
        )
    if not extra:  # kept for the next start; two writers at once each replace it whole
        template.parent.mkdir(exist_ok=True)
        partial = template.with_name(f"{template.name}.{uuid.uuid4().hex}")
        shutil.copyfile(data / _CHECKPOINT, partial)
        os.replace(partial, template)


def _spawn(
    java: str,
    libs: Path,
    workdir: Path,
    properties: Path,
    archive: Path | None,
    recording: Path | None,
    place: Place = HERE,
) -> LocalProcess:
    """Start ``kafka.Kafka`` in the foreground at ``place``, logging to ``kafka.log``.

    With ``recording`` the JVM writes a class-data archive there when it exits.
    """
    argv = [*_java_argv(java, libs, workdir, archive, recording), "kafka.Kafka", str(properties)]
    return LocalProcess.spawn("kafka", place.argv(argv), log_path=workdir / "kafka.log")
