"""``leaseworker.toolkit``, the tools' one way into the library: every name resolves, none is idle.

The type checker reads the names' ``TYPE_CHECKING`` imports and the tools load
them through the module's table of faces; this checks that the two agree and
that the tools (``tools/src/leaseworker_dev``) use every name and no other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import leaseworker.toolkit

TOOLS = Path(__file__).resolve().parents[1] / "tools" / "src" / "leaseworker_dev"


def test_every_name_resolves_to_what_the_type_checker_reads() -> None:
    """Each name in ``__all__`` loads, and is the object its ``TYPE_CHECKING`` import names."""
    source = Path(leaseworker.toolkit.__file__).read_text()
    typed = {
        alias.asname or alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    } - {"annotations", "TYPE_CHECKING", "Any", "importlib"}
    assert set(leaseworker.toolkit.__all__) == typed
    for name in leaseworker.toolkit.__all__:
        assert getattr(leaseworker.toolkit, name) is not None, name


def test_the_tools_use_every_name_and_no_other() -> None:
    """The names imported from the toolkit under tools/ are exactly its ``__all__``."""
    used = {
        alias.name
        for path in TOOLS.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.module == "leaseworker.toolkit"
        for alias in node.names
    }
    assert used == set(leaseworker.toolkit.__all__)
