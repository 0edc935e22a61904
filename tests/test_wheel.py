"""The built wheel: licensed, and its ``leaseworker demo`` finds its files without a checkout.

The wheel is built once per session (hatchling, no build isolation, so no
network) and installed without dependencies into a fresh virtualenv whose
only view of the dependencies is a ``.pth`` line to this environment's
site-packages. That line is a plain directory, so this environment's editable
install of leaseworker is not on the path: ``import leaseworker`` there is the
wheel's copy, which each test checks.
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
    "examples/report_job/demo_report.py",
    "examples/report_job/monthly_report.py",
    "examples/report_job/ready_receiver.py",
)
"""The checkout files ``leaseworker demo`` reads, as the wheel must carry them."""


@dataclass(frozen=True)
class Installed:
    """The built wheel and the virtualenv it is installed in."""

    wheel: Path
    venv: Path

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


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """Build the wheel once and install it (without dependencies) into a fresh venv.

    Both are removed at the end of the session.
    """
    base = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", base / "dist", ROOT],
        check=True,
        timeout=120,
    )
    [wheel] = (base / "dist").glob("leaseworker-*.whl")
    env = base / "venv"
    venv.create(env, with_pip=False)
    subprocess.run(
        [*pip, "--python", env / "bin" / "python", "install", "--no-deps", "--no-index", wheel],
        check=True,
        timeout=120,
    )
    [site] = (env / "lib").glob("python3*/site-packages")
    (site / "zz-test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    yield Installed(wheel=wheel, venv=env)
    shutil.rmtree(base)


def test_the_wheel_carries_the_license_and_what_the_demo_reads(installed: Installed) -> None:
    """LICENSE sits in the dist-info; the pom, Jaeger's module and the demo job are shipped."""
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    [license_file] = [name for name in names if name.endswith(".dist-info/licenses/LICENSE")]
    assert "Apache License" in zipfile.ZipFile(installed.wheel).read(license_file).decode()
    for relative in SHIPPED:
        assert f"leaseworker/_dev/_shipped/{relative}" in names


def test_the_installed_demo_finds_its_files_in_the_package(
    installed: Installed, tmp_path: Path
) -> None:
    """Outside any checkout, help works and the demo's files resolve inside the package.

    That is every file the demo's service preparation reads (the pom, the Go
    module, the pods' job); the cached Kafka jars are found through the shipped pom.
    """
    helped = installed.run("leaseworker", "demo", "--help", cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert "keep-running" in helped.stdout
    probe = textwrap.dedent(
        """
        import leaseworker
        from leaseworker._dev._services._jaeger import deploy_dir
        from leaseworker._dev._services._kafka import ensure_installed, kafka_version
        from leaseworker._dev._services._shipped import shipped
        from leaseworker._dev._stack import EXAMPLE
        print(leaseworker.__file__)
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
        assert Path(path).is_relative_to(site / "_dev" / "_shipped")
    assert (Path(example) / "demo_report.py").is_file()
    assert (Path(libs) / f"kafka_2.13-{version}.jar").is_file()
