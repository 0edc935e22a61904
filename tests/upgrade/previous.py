"""The previous release, built once into a virtualenv of the cache, for pods beside this code.

``releases.toml`` names each release's commit; the newest one below this
code's version is the previous release. Its tree (``git archive`` of the
commit, so a clone without tags works, and one without that history fails in
one line) and a virtualenv with its ``leaseworker[postgres]`` and tools
installed, at the versions of its own constraints.txt, go under
``~/.cache/leaseworker/releases/<commit>/`` (``LEASEWORKER_CACHE``). Building
is held under a lock file and finished by a stamp: safe to run again and from
two test workers at once; a half-built directory is built anew.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from leaseworker import __version__
from leaseworker_dev._services import cache_dir

from ..pods import REPO

STAMP = ".leaseworker-built"


@dataclass(frozen=True)
class BuiltRelease:
    """A release built into the cache: its version, commit, source tree and interpreter."""

    version: str
    commit: str
    tree: Path
    python: Path


def previous_release() -> tuple[str, str]:
    """Return the newest recorded release below this code's version, and its commit."""
    recorded = tomllib.loads((REPO / "releases.toml").read_text(encoding="utf-8"))["releases"]
    current = _key(__version__)
    below = [version for version in recorded if _key(version) < current]
    if not below:
        raise LookupError(f"releases.toml records no release before {__version__}")
    version = max(below, key=_key)
    return version, str(recorded[version])


def build(version: str, commit: str) -> BuiltRelease:
    """Return release ``version`` at ``commit`` built into the cache, building it if needed.

    Raises ``LookupError`` in one line when the commit is not in this clone's
    history, ``RuntimeError`` with pip's last line when the install fails.
    """
    found = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    if found.returncode != 0:
        raise LookupError(
            f"release {version}'s commit {commit[:12]} is not in this clone's history"
            " (a shallow clone? git fetch --unshallow)"
        )
    home = cache_dir("releases", commit)
    release = BuiltRelease(version, commit, home / "tree", home / "venv" / "bin" / "python")
    with (home.parent / f"{commit}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / STAMP).exists():
            _build(release)
            (home / STAMP).write_text(f"{version}\n", encoding="utf-8")
    return release


def _build(release: BuiltRelease) -> None:
    home = release.tree.parent
    for part in ("tree", "venv"):
        shutil.rmtree(home / part, ignore_errors=True)
    release.tree.mkdir()
    archive = subprocess.Popen(
        ["git", "-C", str(REPO), "archive", "--format=tar", release.commit],
        stdout=subprocess.PIPE,
    )
    subprocess.run(["tar", "-x", "-C", str(release.tree)], stdin=archive.stdout, check=True)
    assert archive.stdout is not None
    archive.stdout.close()
    if archive.wait() != 0:
        raise RuntimeError(f"git archive {release.commit} failed")
    subprocess.run([sys.executable, "-m", "venv", str(home / "venv")], check=True)
    # pip's own wheel cache (as scripts/bootstrap.sh uses it) makes a rebuild quick.
    installed = subprocess.run(
        [
            *(str(release.python), "-m", "pip", "install", "-q", "--disable-pip-version-check"),
            *("-c", str(release.tree / "constraints.txt")),
            f"{release.tree}[postgres]",
            str(release.tree / "tools"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_REQUIRE_VIRTUALENV": "0"},
        check=False,
    )
    if installed.returncode != 0:
        last = (installed.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"installing release {release.version} failed: {last}")


def _key(version: str) -> tuple[int, ...]:
    """Order ``MAJOR.MINOR.PATCH`` (a ``.devN`` suffix sorts as its release, which it precedes)."""
    base = version.partition(".dev")[0]
    return tuple(int(part) for part in base.split("."))
