"""Find the checkout files the demo needs, in a clone and in an installed wheel alike.

The Kafka pom, Jaeger's Go module and the demo's report job live in the
repository (``deploy/local/...``, ``examples/report_job/``). The wheel carries
copies of them under ``leaseworker_dev/_shipped/`` at the same relative paths
(``force-include`` in tools/pyproject.toml), so ``pip install leaseworker-dev`` gives a
working ``leaseworker demo``; a clone or an editable install reads the
originals.
"""

from __future__ import annotations

from pathlib import Path


class ToolMissingError(RuntimeError):
    """A local service cannot be provisioned here: a tool or a shipped file is missing.

    Raised by the ``_services`` starters; the message is one line naming what to
    install, so ``leaseworker demo`` prints it and exits 2 instead of a traceback.
    """


PACKAGED = Path(__file__).resolve().parents[1] / "_shipped"
"""Where a wheel keeps its copies (absent in a clone)."""

CHECKOUT = Path(__file__).resolve().parents[4]
"""The repository root when this module is imported from a clone's ``src/``."""


def shipped(relative: str) -> Path:
    """Return the file or directory ``relative`` (to the repository root) as installed.

    The wheel's copy wins over a checkout's, so an installed package never
    reads whatever directory happens to sit four levels above it. Raises
    :class:`ToolMissingError` when neither exists (a broken install).
    """
    for root in (PACKAGED, CHECKOUT):
        path = root / relative
        if path.exists():
            return path
    raise ToolMissingError(
        f"{relative} is missing from this leaseworker installation (looked in {PACKAGED} "
        f"and {CHECKOUT}); reinstall the package or run from a clone"
    )
