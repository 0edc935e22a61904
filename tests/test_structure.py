"""The import structure of every package in ``src/``: no cycle between modules, no side door.

Read from the source as text (nothing is imported). An import under ``if TYPE_CHECKING:``
does not count (it never runs); one inside a function does (it runs when called, and a cycle
through it is a cycle all the same). A *side door* is an import of another package's private
module (``leaseworker._store._fencing`` from ``leaseworker._worker``): boxes are entered through
their face, the package's ``__init__``, so a box can move its modules without breaking its
neighbours. A module may import the private modules of its own package and of the packages
that contain it.
"""

from __future__ import annotations

import ast
import graphlib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(p.parent for p in ROOT.glob("src/*/__init__.py")) + sorted(
    p.parent for p in ROOT.glob("*/src/*/__init__.py")
)


@dataclass(frozen=True)
class Module:
    """One module of the tree: its dotted name and its file."""

    name: str
    path: Path

    @property
    def is_package(self) -> bool:
        """Whether it is a package's ``__init__``."""
        return self.path.name == "__init__.py"

    @property
    def package(self) -> str:
        """The package it belongs to (itself, for a package)."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


def find_modules(packages: list[Path]) -> dict[str, Module]:
    """Every module under the top-level package folders ``packages``, by dotted name."""
    found: dict[str, Module] = {}
    for top in packages:
        for path in top.rglob("*.py"):
            parts = path.relative_to(top.parent).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = Module(name, path)
    return found


def _type_checking_only(tree: ast.Module) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return skipped


def imported_names(module: Module) -> set[str]:
    """Every dotted name ``module`` imports at run time: modules, and ``module.name`` pairs."""
    tree = ast.parse(module.path.read_text(encoding="utf-8"))
    skipped = _type_checking_only(tree)
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.package.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)
    return names


def private_module(name: str, modules: dict[str, Module]) -> Module | None:
    """The private, non-package module that the dotted ``name`` is or lies in, if any."""
    parts = name.split(".")
    for end in range(1, len(parts) + 1):
        found = modules.get(".".join(parts[:end]))
        leaf = parts[end - 1]
        if found and leaf.startswith("_") and not leaf.startswith("__") and not found.is_package:
            return found
    return None


@dataclass
class Structure:
    """The modules, the run-time imports between them, and the side doors among them."""

    modules: dict[str, Module]
    edges: dict[str, set[str]]
    side_doors: list[str]


def read_structure(packages: list[Path]) -> Structure:
    """Read the structure of the top-level package folders ``packages``."""
    modules = find_modules(packages)
    edges: dict[str, set[str]] = {}
    doors: set[str] = set()
    for module in modules.values():
        names = imported_names(module)
        edges[module.name] = {
            target
            for target in names
            if target in modules and not module.name.startswith(f"{target}.")
            if target != module.name
        }
        for target in names:
            private = private_module(target, modules)
            if private is None:
                continue
            owner = private.package
            if module.name != owner and not module.name.startswith(f"{owner}."):
                doors.add(f"{module.name} imports {private.name}")
    return Structure(modules, edges, sorted(doors))


def import_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of imports between modules, or ``None`` when there is none."""
    try:
        graphlib.TopologicalSorter(edges).prepare()
    except graphlib.CycleError as exc:
        cycle: list[str] = exc.args[1]
        return cycle
    return None


@pytest.fixture(scope="module")
def structure() -> Structure:
    """The structure of every package in ``src/`` (and ``*/src/``)."""
    assert SOURCES, "no package found under src/"
    return read_structure(SOURCES)


def test_no_module_imports_another_in_a_cycle(structure: Structure) -> None:
    """No module imports itself around a loop at run time."""
    cycle = import_cycle(structure.edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_every_box_is_entered_through_its_face(structure: Structure) -> None:
    """No module imports another package's private module."""
    assert not structure.side_doors, "side doors:\n" + "\n".join(structure.side_doors)


def test_a_test_file_reaches_inside_one_box_at_most(structure: Structure) -> None:
    """A test file imports private modules of one package at most: the box it tests.

    Every other box it uses, it uses through its face, so an internal move of
    that box does not break it.
    """
    wide = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        module = Module("tests._", path)
        boxes = {
            found.package
            for name in imported_names(module)
            if (found := private_module(name, structure.modules))
        }
        if len(boxes) > 1:
            wide.append(f"{path.relative_to(ROOT)}: {', '.join(sorted(boxes))}")
    assert not wide, "test files inside more than one box:\n" + "\n".join(wide)


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """A planted cycle and planted side doors are found; a type-checking import is not."""
    box = tmp_path / "box"
    for folder in (box, box / "_a", box / "b"):
        folder.mkdir()
        (folder / "__init__.py").write_text("")
    (box / "_a" / "_x.py").write_text("from ..b import _y\n")
    (box / "b" / "_y.py").write_text("def later() -> None:\n    from .._a._x import thing\n")
    (box / "b" / "_z.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .._a import _x\n"
    )
    planted = read_structure([box])
    cycle = import_cycle(planted.edges)
    assert cycle is not None
    assert set(cycle) == {"box._a._x", "box.b._y"}
    assert planted.side_doors == ["box._a._x imports box.b._y", "box.b._y imports box._a._x"]
