"""The worker image with Podman: size, build times, container start to ready, SIGTERM to exit.

Builds deploy/Dockerfile on the local Debian base (tests/deploy/podman.py
makes it with debootstrap when missing, and that time is reported too): once
with no layer cache (cold), once with every layer cached, and once after a
one-line source edit (only the package layer rebuilds). Then starts worker
containers (read-only root, host network, the image's default job) against
a private Kafka and Redis, timing ``podman run`` to the first 200 from
/readyz, and ``podman stop`` (SIGTERM) of the idle worker to its exit.

    .venv/bin/python bench/container.py [--starts 5] [--fresh-base]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.deploy.podman

from tests.deploy.podman import BASE_IMAGE, IMAGE_NAME, Podman, build_image, ensure_base, podman

from leaseworker_dev._services import LocalRedis
from leaseworker_dev._services._kafka import LocalKafka
from leaseworker_dev._services._proc import free_port

READY_WITHIN = 120.0


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as reply:
            return int(reply.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def start_and_stop(
    engine: Podman, image: str, kafka: LocalKafka, redis: LocalRedis
) -> tuple[float, float]:
    """One container: seconds from `podman run` to ready, and from `podman stop` to exited."""
    name, port = f"lw-bench-{uuid.uuid4().hex[:8]}", free_port()
    env = {
        "LEASEWORKER_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "LEASEWORKER_REDIS_URL": redis.url,
        "LEASEWORKER_STORE_URL": "sqlite:////tmp/completions.sqlite3",  # the tmpfs /tmp
        "LEASEWORKER_GROUP": f"bench-{name}",
        "LEASEWORKER_HEALTH_PORT": str(port),
        "LEASEWORKER_HEALTH_HOST": "127.0.0.1",
    }
    flags = [f"--env={key}={value}" for key, value in env.items()]
    started = time.monotonic()
    engine("run", "--detach", "--name", name, "--network", "host", "--read-only", *flags, image)
    try:
        while not _ready(port):
            if time.monotonic() - started > READY_WITHIN:
                raise SystemExit(
                    f"{name} not ready in {READY_WITHIN}s: {engine('logs', name).stderr}"
                )
            time.sleep(0.05)
        ready = time.monotonic() - started
        stopping = time.monotonic()
        engine("stop", "--time", "45", name, timeout=90)
        stopped = time.monotonic() - stopping
        code = engine("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
        if code != "0":
            raise SystemExit(f"{name} exited {code} on SIGTERM")
    finally:
        engine("rm", "--force", "--time", "0", name, check=False)
    return ready, stopped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=5, help="containers started and stopped")
    parser.add_argument("--fresh-base", action="store_true", help="remake the base image first")
    args = parser.parse_args()
    engine = podman()
    if args.fresh_base:
        engine("rmi", BASE_IMAGE, check=False)
    base_started = time.monotonic()
    had_base = engine.exists(BASE_IMAGE)
    ensure_base(engine)
    base_seconds = 0.0 if had_base else time.monotonic() - base_started
    tag = f"{IMAGE_NAME}:bench"
    cold = build_image(engine, base=BASE_IMAGE, tag=tag, cache=False)
    cached = build_image(engine, base=BASE_IMAGE, tag=f"{tag}-cached")  # every layer cached
    edited = build_image(engine, base=BASE_IMAGE, tag=f"{tag}-edit", edit=True)
    engine("rmi", f"{tag}-cached", f"{tag}-edit", check=False)
    size = int(engine("image", "inspect", "--format", "{{.Size}}", tag).stdout)
    base_size = int(engine("image", "inspect", "--format", "{{.Size}}", BASE_IMAGE).stdout)
    kafka, redis = LocalKafka.start(), LocalRedis.start()
    try:
        kafka.create_topics(["reports.requested", "reports.dead-letter"], exist_ok=True)
        runs = [start_and_stop(engine, tag, kafka, redis) for _ in range(args.starts)]
    finally:
        kafka.stop()
        redis.stop()
        engine("rmi", tag, check=False)
    ready = [r for r, _ in runs]
    stopped = [s for _, s in runs]
    print(f"base image (debootstrap + import): {base_seconds:.1f}s (0: cached)")
    print(f"base image size: {base_size / 1e6:.0f} MB")
    print(f"image size: {size / 1e6:.0f} MB ({(size - base_size) / 1e6:.0f} MB over the base)")
    print(f"build cold (no layer cache): {cold.seconds:.1f}s")
    print(f"build cached (every layer): {cached.seconds:.1f}s")
    print(f"build after a source edit (package layer only): {edited.seconds:.1f}s")
    print(
        f"podman run to /readyz 200 ({len(ready)} starts): median {statistics.median(ready):.2f}s, "
        f"max {max(ready):.2f}s"
    )
    print(
        f"podman stop (SIGTERM, idle) to exit 0: median {statistics.median(stopped):.2f}s, "
        f"max {max(stopped):.2f}s"
    )


if __name__ == "__main__":
    main()
