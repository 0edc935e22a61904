"""The two wheels: the library alone runs and names the tools; with them the demo finds its files.

Both wheels (``leaseworker`` and ``leaseworker-dev`` from tools/) are built once
per session (hatchling, no build isolation, so no network) and installed
without dependencies into fresh virtualenvs, one with the library alone and
one with both, whose only view of the dependencies is a ``.pth`` line to a
directory of links to this environment's site-packages, less leaseworker's
own editable installs (their code and their entry points). So ``import
leaseworker`` there is the wheel's copy, which each test checks.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import textwrap
import venv
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SHIPPED = (
    "deploy/local/kafka/pom.xml",
    "deploy/local/jaeger/go.mod",
    "deploy/local/jaeger/go.sum",
    "deploy/local/clockshift/clockshift.c",
    "examples/report_job/demo_report.py",
    "examples/report_job/monthly_report.py",
    "examples/report_job/ready_receiver.py",
    "tools/porcupine/go.mod",
    "tools/porcupine/go.sum",
    "tools/porcupine/main.go",
)
"""The checkout files ``leaseworker demo`` (and ``chaos``) read, as the wheel must carry them."""


LIBRARY_HOLDS_NONE = ("_dev", "_campaign", "_shipped", "pom.xml", "go.mod", "go.sum", "examples")
"""Parts of a path that only the tools' wheel may hold."""


@dataclass(frozen=True)
class Installed:
    """A built wheel (and the tools' one, when installed too) and the virtualenv they are in."""

    wheel: Path
    venv: Path
    tools: Path | None = None

    @property
    def python(self) -> Path:
        """The virtualenv's interpreter."""
        return self.venv / "bin" / "python"

    def run(self, *argv: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` (a program in the virtualenv's bin/) in ``cwd``."""
        program, *rest = argv
        return subprocess.run(
            [str(self.venv / "bin" / program), *map(str, rest)],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """Build the library's wheel and the tools' once; removed at the end of the session."""
    base = tmp_path_factory.mktemp("wheels")
    for project in (ROOT, ROOT / "tools"):
        subprocess.run(
            [*PIP, "wheel", "--no-deps", "--no-build-isolation", "-w", base, project],
            check=True,
            timeout=120,
        )
    [library] = base.glob("leaseworker-*.whl")
    [tools] = base.glob("leaseworker_dev-*.whl")
    yield library, tools
    shutil.rmtree(base)


def _venv(base: Path, *wheels: Path) -> Path:
    """A fresh virtualenv with ``wheels`` installed, seeing this one's other packages."""
    env = base / "venv"
    venv.create(env, with_pip=False)
    subprocess.run(
        [*PIP, "--python", env / "bin" / "python", "install", "--no-deps", "--no-index", *wheels],
        check=True,
        timeout=120,
    )
    deps = base / "deps"
    deps.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.lower().lstrip("_").startswith(("leaseworker", "editable")):
            (deps / entry.name).symlink_to(entry)
    [site] = (env / "lib").glob("python3*/site-packages")
    (site / "zz-test-dependencies.pth").write_text(f"{deps}\n")
    return env


@pytest.fixture(scope="session")
def library(
    wheels: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installed]:
    """The library's wheel alone in a fresh virtualenv."""
    base = tmp_path_factory.mktemp("library")
    yield Installed(wheel=wheels[0], venv=_venv(base, wheels[0]))
    shutil.rmtree(base)


@pytest.fixture(scope="session")
def installed(
    wheels: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installed]:
    """Both wheels in a fresh virtualenv."""
    base = tmp_path_factory.mktemp("both")
    yield Installed(wheel=wheels[0], tools=wheels[1], venv=_venv(base, *wheels))
    shutil.rmtree(base)


def test_the_library_wheel_carries_the_license_and_no_tooling(library: Installed) -> None:
    """LICENSE sits in the dist-info; no launcher, campaign, build file, example or plugin."""
    wheel = zipfile.ZipFile(library.wheel)
    names = set(wheel.namelist())
    [license_file] = [name for name in names if name.endswith(".dist-info/licenses/LICENSE")]
    assert "Apache License" in wheel.read(license_file).decode()
    for name in names:
        assert not set(Path(name).parts) & set(LIBRARY_HOLDS_NONE), name
        assert not name.startswith("leaseworker_dev"), name
    [entry_points] = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
    assert "pytest11" not in wheel.read(entry_points).decode()


def test_the_library_alone_runs_and_names_the_tools_for_the_demo(
    library: Installed, tmp_path: Path
) -> None:
    """``leaseworker run`` works; ``demo`` and ``chaos`` exit 2 in one line naming the tools."""
    run = library.run("leaseworker", "run", "--help", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "--bootstrap-servers" in run.stdout
    helped = library.run("leaseworker", "--help", cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert " run " in helped.stdout
    assert " demo " not in helped.stdout
    for command in ("demo", "chaos"):
        done = library.run("leaseworker", command, cwd=tmp_path)
        assert done.returncode == 2
        [line] = done.stderr.splitlines()
        assert "leaseworker-dev" in line
    where = library.run(
        "python", "-c", "import leaseworker; print(leaseworker.__file__)", cwd=tmp_path
    )
    assert Path(where.stdout.strip()).is_relative_to(library.venv)


def test_the_wheel_carries_the_license_and_what_the_demo_reads(installed: Installed) -> None:
    """LICENSE sits in the dist-info; the pom, Jaeger's module and the demo job are shipped."""
    assert installed.tools is not None
    names = set(zipfile.ZipFile(installed.tools).namelist())
    [license_file] = [name for name in names if name.endswith(".dist-info/licenses/LICENSE")]
    assert "Apache License" in zipfile.ZipFile(installed.tools).read(license_file).decode()
    for relative in SHIPPED:
        assert f"leaseworker_dev/_shipped/{relative}" in names


def test_the_installed_demo_finds_its_files_in_the_package(
    installed: Installed, tmp_path: Path
) -> None:
    """Outside any checkout, help works and the demo's files resolve inside the package.

    That is every file the demo's service preparation reads (the pom, the Go
    module, the pods' job); the cached Kafka jars are found through the shipped pom.
    """
    listed = installed.run("leaseworker", "--help", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert " demo " in listed.stdout
    helped = installed.run("leaseworker", "demo", "--help", cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert "keep-running" in helped.stdout
    probe = textwrap.dedent(
        """
        import leaseworker_dev
        from leaseworker_dev._services._local_jaeger import deploy_dir
        from leaseworker_dev._services._kafka import ensure_installed, kafka_version
        from leaseworker_dev._services._shipped import shipped
        from leaseworker_dev._demos._stack_demo import EXAMPLE
        print(leaseworker_dev.__file__)
        print(shipped("deploy/local/kafka/pom.xml"))
        print(deploy_dir())
        print(shipped(EXAMPLE))
        print(ensure_installed())
        print(kafka_version())
        """
    )
    result = installed.run("python", "-c", probe, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    package, pom, module, example, libs, version = result.stdout.split()
    site = Path(package).parent
    assert site.is_relative_to(installed.venv)
    for path in (pom, module, example):
        assert Path(path).is_relative_to(site / "_shipped")
    assert (Path(example) / "demo_report.py").is_file()
    assert (Path(libs) / f"kafka_2.13-{version}.jar").is_file()
