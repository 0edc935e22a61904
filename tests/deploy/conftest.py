"""Fixtures for the container tests: Podman, the worker image, and containers removed after.

The image is built once per session and kept across sessions under the hash of
its build context (tests/deploy/podman.py), so an unchanged tree starts from a
cached image. Every container and pod a test creates carries this session's
label and is removed in teardown; only the images stay cached.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from leaseworker_dev._services import LocalKafka, LocalPostgres, LocalRedis, free_port

from ..kafka_util import KafkaNames
from .podman import (
    LABEL,
    REPO,
    Built,
    Container,
    Podman,
    PodmanUnavailable,
    build_image,
    ensure_base,
)
from .podman import podman as find_podman

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Whichever container test comes first may make the base image and build (minutes)."""
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.timeout(900))


@pytest.fixture(scope="session")
def engine() -> Iterator[Podman]:
    """Podman, or a skip (one line) where it cannot start a container at all."""
    try:
        found = find_podman()
    except PodmanUnavailable as reason:
        pytest.skip(str(reason))
    yield found
    _remove_labelled(found)


def _remove_labelled(engine: Podman) -> None:
    """Remove any container of this session still there (the fixtures remove their own)."""
    listed = engine("ps", "-a", "-q", "--filter", f"label={LABEL}", check=False)
    if ids := listed.stdout.split():
        engine("rm", "--force", "--time", "0", *ids, check=False)


@pytest.fixture(scope="session")
def built(engine: Podman) -> Built:
    """The worker image built from this tree on the local Debian base (cached by content)."""
    try:
        base = ensure_base(engine)
    except PodmanUnavailable as reason:
        pytest.skip(str(reason))
    started = engine("run", "--rm", "--network", "host", base, "true", check=False)
    if started.returncode != 0:
        why = (started.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"podman cannot start a container here: {why}")
    image = build_image(engine, base=base)
    print(f"worker image {image.tag}: built in {image.seconds:.1f}s (0: cached)")
    return image


@pytest.fixture(scope="session")
def image(built: Built) -> str:
    """The worker image's tag."""
    return built.tag


@pytest.fixture
def markers_dir(tmp_path: Path) -> Path:
    """A directory the containers' uid 10001 may write their history files into."""
    path = tmp_path / "marks"
    path.mkdir()
    path.chmod(0o777)
    return path


@pytest.fixture
def worker_env(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    postgres_server: LocalPostgres,
    kafka_names: KafkaNames,
    namespace: str,
) -> dict[str, str]:
    """Settings of a worker container reaching the suite's services over the host network."""
    return {
        "LEASEWORKER_BOOTSTRAP_SERVERS": kafka_server.bootstrap_servers,
        "LEASEWORKER_REDIS_URL": redis_server.url,
        "LEASEWORKER_STORE_URL": postgres_server.create_database(f"c{uuid.uuid4().hex[:12]}"),
        "LEASEWORKER_GROUP": kafka_names.group,
        "LEASEWORKER_NAMESPACE": namespace,
        "LEASEWORKER_HEALTH_HOST": "127.0.0.1",
        "LW_TEST_TOPIC": kafka_names.topic,
    }


@pytest.fixture
def containers(
    engine: Podman, image: str, worker_env: dict[str, str], markers_dir: Path, tmp_path: Path
) -> Iterator[Callable[..., Container]]:
    """Start ``leaseworker run tests.jobs:MarkerJob`` containers; remove them all after.

    Read-only root filesystem, host network, this tree's tests/ mounted
    read-only (for the test jobs), settings from an env file (no secret on a
    command line), the image's own user.
    """
    started: list[str] = []

    def start(name: str, *args: str, **env: str) -> Container:
        pod, name = name, f"lw-{name}-{uuid.uuid4().hex[:6]}"
        port = free_port()
        settings = {**worker_env, "LEASEWORKER_HEALTH_PORT": str(port), "LEASEWORKER_POD": pod}
        env_file = tmp_path / f"{name}.env"
        env_file.write_text("".join(f"{k}={v}\n" for k, v in {**settings, **env}.items()))
        env_file.chmod(0o600)
        started.append(name)
        engine(
            "run", "--detach", "--name", name, "--label", LABEL, "--network", "host",
            "--read-only", "--env-file", str(env_file),
            "--volume", f"{REPO / 'tests'}:/app/tests:ro", "--volume", f"{markers_dir}:/marks",
            image, "tests.jobs:MarkerJob", "--record-history", f"/marks/history-{pod}.jsonl", *args,
        )  # fmt: skip
        return Container(name, pod, port, markers_dir / f"history-{pod}.jsonl", engine)

    yield start
    if started:
        engine("rm", "--force", "--time", "0", *started, check=False)
