"""deploy/compose.yaml run with podman-compose, through deploy/compose.podman.yaml.

No registry is reachable here, so the services that need a published image
(Kafka, Redis, PostgreSQL, Jaeger, the topic creator) are named and not
started; the worker and the trigger producer run from the locally built image
against the suite's own services on the host network. There is no systemd to
run healthchecks on a timer, so the test runs the worker's (the /readyz
check) with ``podman healthcheck run``. podman-compose starts the producer
without waiting for that health (its ``service_healthy`` is a start order
here); the worker reads the topic from the earliest offset, so nothing is lost.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import yaml

from leaseworker_dev._services import LocalKafka, LocalPostgres, LocalRedis, free_port

from ..waiting import eventually
from .podman import REPO, Podman
from .reports import PARTITIONS, TOPIC, all_committed, topic_size

COMPOSE = REPO / "deploy" / "compose.yaml"
OVERRIDE = REPO / "deploy" / "compose.podman.yaml"
TRIGGERS = 12  # the trigger service: 4 tenants x 3 periods


def _podman_compose() -> str:
    found = shutil.which("podman-compose") or str(Path(sys.executable).with_name("podman-compose"))
    if not Path(found).exists():
        pytest.fail("podman-compose is not installed: scripts/bootstrap.sh installs .[dev]")
    return found


def _published_services() -> dict[str, str]:
    """Services of compose.yaml that run a published image (no build), by name."""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    return {name: s["image"] for name, s in services.items() if "build" not in s}


def test_the_services_needing_published_images_are_named_and_left_out(engine: Podman) -> None:
    """Kafka, Redis, PostgreSQL, Jaeger and the topic creator: pulled images, so not run here."""
    published = _published_services()
    assert set(published) == {"kafka", "kafka-init", "redis", "postgres", "jaeger"}
    missing = sorted({image for image in published.values() if not engine.exists(image)})
    if missing:
        pytest.skip(f"no registry here for {', '.join(missing)}: worker and trigger run alone")


@pytest.fixture
def project(engine: Podman) -> Iterator[str]:
    """A compose project name of this test's own, brought down (and checked gone) after."""
    name = f"lwc{uuid.uuid4().hex[:8]}"
    yield name
    subprocess.run(
        [_podman_compose(), "-p", name, "-f", str(COMPOSE), "-f", str(OVERRIDE), "down", "-t", "0"],
        env=engine.env, capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    left = engine("ps", "-a", "-q", "--filter", f"label=io.podman.compose.project={name}").stdout
    assert left.strip() == ""


async def test_compose_runs_the_worker_and_the_trigger_producer_from_the_local_image(
    engine: Podman,
    image: str,
    project: str,
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    postgres_server: LocalPostgres,
    tmp_path: Path,
) -> None:
    """`up` starts the worker and the producer; the worker turns healthy and runs 12 triggers.

    Every trigger is committed by the worker's group, the producer exits 0, and
    `podman-compose stop` (SIGTERM, the file's stop_grace_period) exits the worker 0.
    """
    kafka_server.create_topics([TOPIC, "reports.dead-letter"], partitions=PARTITIONS, exist_ok=True)
    group = f"compose-{project}"
    env = {
        **engine.env,
        "LW_IMAGE": image,
        "LW_BOOTSTRAP_SERVERS": kafka_server.bootstrap_servers,
        "LW_REDIS_URL": redis_server.url,
        "LW_STORE_URL": postgres_server.create_database(project),
        "LW_GROUP": group,
        "LW_HEALTH_PORT": str(free_port()),
    }
    before = await topic_size(kafka_server.bootstrap_servers)
    compose = [_podman_compose(), "-p", project, "-f", str(COMPOSE), "-f", str(OVERRIDE)]
    log = tmp_path / "up.log"
    with log.open("wb") as out:
        up = subprocess.Popen(  # noqa: ASYNC220 - polled below, never waited on
            [*compose, "up", "-d", "--no-build"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    worker = f"{project}_worker_1"

    async def healthy() -> bool:
        return engine("healthcheck", "run", worker, check=False).returncode == 0

    try:
        await eventually(healthy, within=90)
    except TimeoutError:
        health = engine("inspect", "--format", "{{json .State.Health}}", worker, check=False)
        raise AssertionError(f"{worker} never healthy: {health.stdout[-2000:]}") from None
    with anyio.fail_after(60):
        while up.poll() is None:  # noqa: ASYNC110 - a child process
            await anyio.sleep(0.2)
    assert up.returncode == 0, log.read_text()[-3000:]
    trigger = f"{project}_trigger_1"
    code = engine("wait", trigger, timeout=120).stdout.strip()
    assert code == "0", engine("logs", trigger, check=False).stderr[-2000:]

    await eventually(lambda: all_committed(kafka_server.bootstrap_servers, group), within=120)
    assert await topic_size(kafka_server.bootstrap_servers) == before + TRIGGERS
    await anyio.run_process([*compose, "stop", "worker"], env=env, check=True)
    assert engine("inspect", "--format", "{{.State.ExitCode}}", worker).stdout.strip() == "0"
