"""Helpers (no tests): Podman as it runs on these machines, the base image and the worker image.

Podman is driven through its CLI with two configuration files of our own
(``CONTAINERS_CONF``, ``CONTAINERS_STORAGE_CONF``), so podman, podman-compose
and ``podman kube play`` all see the same settings: runc with no default
ulimits (crun's ``setrlimit`` is refused here), cgroupfs, host network, and
image storage under the cache outside the clone (``LEASEWORKER_PODMAN_STORAGE``
moves it). No registry is reachable, so the base image is made from Debian
packages with debootstrap, once; the worker image is tagged with a hash of
its build context and built only when that content changed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from leaseworker.toolkit import Execution, History, merge
from leaseworker_dev._services import cache_dir

REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = "localhost/debian-python:bookworm"
IMAGE_NAME = "localhost/leaseworker"
CONTEXT = ("pyproject.toml", "README.md", "constraints.txt", "src", "examples")
"""What the Dockerfile copies: the build context is made of these only."""

DEBIAN_MIRROR = "http://deb.debian.org/debian"
LABEL = f"leaseworker.test={uuid.uuid4().hex[:12]}"
"""Set on every container and pod this session creates, so teardown removes exactly those."""


class PodmanUnavailable(Exception):
    """Podman cannot start a container here (the message says why, in one line)."""


@dataclass(frozen=True)
class Podman:
    """The ``podman`` CLI with this project's configuration files."""

    executable: str
    home: Path

    @property
    def env(self) -> dict[str, str]:
        """The environment every podman (and podman-compose) call runs with."""
        return {
            **os.environ,
            "CONTAINERS_CONF": str(self.home / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(self.home / "storage.conf"),
        }

    def __call__(
        self, *args: str, check: bool = True, timeout: float = 120, stdin: bytes | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``podman ARGS``; raise with its stderr when ``check`` and it fails."""
        done = subprocess.run(
            [self.executable, *args],
            env=self.env,
            input=stdin.decode() if stdin is not None else None,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"podman {' '.join(args[:3])}... exited {done.returncode}: {done.stderr[-2000:]}"
            )
        return done

    def exists(self, image: str) -> bool:
        """Whether ``image`` is in local storage."""
        return self("image", "exists", image, check=False).returncode == 0


def podman() -> Podman:
    """Podman configured for this machine; raises :class:`PodmanUnavailable` if it cannot run."""
    executable = shutil.which("podman")
    if executable is None or shutil.which("runc") is None:
        raise PodmanUnavailable(
            "podman or runc is not installed (scripts/bootstrap.sh installs them)"
        )
    home = Path(os.environ.get("LEASEWORKER_PODMAN_STORAGE") or cache_dir("podman"))
    home.mkdir(parents=True, exist_ok=True)
    # Transient state, one directory per storage (Podman refuses a storage whose run
    # directory changed, and two storages must not share one).
    tag = hashlib.sha256(str(home).encode()).hexdigest()[:8]
    run = Path(f"/run/leaseworker-podman-{os.getuid()}-{tag}")
    if os.getuid() != 0:
        run = Path(os.environ.get("XDG_RUNTIME_DIR", tempfile.gettempdir()), f"lwpodman-{tag}")
    _write(
        home / "containers.conf",
        '[containers]\ndefault_ulimits = []\nnetns = "host"\n\n'
        f'[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\n'
        f'events_logger = "file"\ntmp_dir = "{run}/tmp"\n',
    )
    _write(
        home / "storage.conf",
        f'[storage]\ndriver = "overlay"\ngraphroot = "{home}/storage"\nrunroot = "{run}/run"\n',
    )
    found = Podman(executable, home)
    probe = found("info", "--format", "{{.Host.OCIRuntime.Name}}", check=False, timeout=60)
    if probe.returncode != 0:
        reason = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        raise PodmanUnavailable(f"podman cannot run here: {reason}")
    return found


def _write(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def ensure_base(engine: Podman) -> str:
    """The local Debian base image (python3, venv, CA certificates), made once with debootstrap."""
    if engine.exists(BASE_IMAGE):
        return BASE_IMAGE
    debootstrap = shutil.which("debootstrap") or shutil.which("debootstrap", path="/usr/sbin")
    if debootstrap is None:
        raise PodmanUnavailable("debootstrap is not installed: no base image can be made here")
    root = Path(tempfile.mkdtemp(prefix="rootfs-", dir=engine.home))
    try:
        subprocess.run(
            [debootstrap, "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
             "bookworm", str(root), DEBIAN_MIRROR],
            capture_output=True, check=True, timeout=900,
        )  # fmt: skip
        with subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE) as tar:
            subprocess.run(
                [engine.executable, "import", "-", BASE_IMAGE],
                stdin=tar.stdout, env=engine.env, capture_output=True, check=True, timeout=600,
            )  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return BASE_IMAGE


def context_hash(base_id: str) -> str:
    """A hash of the Dockerfile, the build context's files and the base image's id."""
    digest = hashlib.sha256(base_id.encode())
    for path in [REPO / "deploy" / "Dockerfile", *_context_files()]:
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _context_files() -> list[Path]:
    files: list[Path] = []
    for name in CONTEXT:
        path = REPO / name
        if path.is_file():
            files.append(path)
            continue
        files.extend(
            sorted(
                p for p in path.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc")
            )
        )  # fmt: skip
    return files


@dataclass(frozen=True)
class Built:
    """The worker image: its tag and how long the build took (0 when it was already there)."""

    tag: str
    seconds: float


def build_image(
    engine: Podman, *, base: str, tag: str | None = None, cache: bool = True, edit: bool = False
) -> Built:
    """Build deploy/Dockerfile on ``base`` unless an image of the same content hash exists.

    The context is a copy of :data:`CONTEXT` only (no ``.venv``, no caches).
    ``cache=False`` builds every layer anew (a cold build); ``edit`` changes
    one source file in the copy first (a rebuild after a source edit).
    Pip reaches the index over the host network with the CA bundle ``PIP_CERT``
    names, given as a build secret, so it is in no layer.
    """
    base_id = engine("image", "inspect", "--format", "{{.Id}}", base).stdout.strip()
    hashed = tag is None
    tag = tag or f"{IMAGE_NAME}:{context_hash(base_id)}"
    if cache and not edit and engine.exists(tag):
        return Built(tag, 0.0)
    with tempfile.TemporaryDirectory(prefix="lwctx-", dir=engine.home) as context:
        for path in _context_files():
            target = Path(context, path.relative_to(REPO))
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        if edit:
            with Path(context, "src", "leaseworker", "_version.py").open("a") as version:
                version.write(f"# edited {uuid.uuid4().hex}\n")
        dockerfile = str(REPO / "deploy" / "Dockerfile")
        args = ["build", "--format", "docker", "--network", "host", "--build-arg", f"BASE={base}"]
        args += ["-f", dockerfile, "-t", tag] + ([] if cache else ["--no-cache"])
        cert = os.environ.get("PIP_CERT")
        if cert and Path(cert).is_file():
            args += ["--secret", f"id=pip_cert,src={cert}"]
        started = time.monotonic()
        engine(*args, context, timeout=1200)
        seconds = time.monotonic() - started
    if hashed:
        _remove_older(engine, keep=tag)
    return Built(tag, seconds)


def _remove_older(engine: Podman, *, keep: str) -> None:
    """Untag worker images of older content, so the cache holds one (plus shared layers)."""
    listed = engine("images", "--format", "{{.Repository}}:{{.Tag}}", IMAGE_NAME).stdout.split()
    old = [name for name in listed if name != keep and len(name) == len(keep)]
    if old:
        engine("rmi", *old, check=False)  # not --force: a running container keeps its image


@dataclass
class Container:
    """One worker container: its name, pod name, health port and history file on the host."""

    name: str
    pod: str
    health_port: int
    history: Path
    engine: Podman

    def logs(self) -> str:
        """Everything the container wrote to stdout and stderr."""
        done = self.engine("logs", self.name, check=False)
        return done.stdout + done.stderr

    def exit_code(self) -> int:
        """The exit code of the stopped container."""
        return int(self.engine("inspect", "--format", "{{.State.ExitCode}}", self.name).stdout)

    def inside(self, path: str) -> int:
        """GET ``path`` on the health port from inside the container; return the status."""
        code = (
            "import sys, urllib.request as u, urllib.error as e\n"
            "try: print(u.urlopen(sys.argv[1], timeout=3).status)\n"
            "except e.HTTPError as x: print(x.code)\n"
        )
        url = f"http://127.0.0.1:{self.health_port}{path}"
        return int(self.engine("exec", self.name, "python3", "-c", code, url).stdout)


def recorded(containers: list[Container]) -> list[Execution]:
    """What the containers' ``--record-history`` files hold, in start order (one clock)."""
    found = [History.from_json(c.history.read_text()) for c in containers if c.history.exists()]
    return sorted(merge(found).executions, key=lambda e: e.start) if found else []
