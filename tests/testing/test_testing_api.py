"""``leaseworker.testing``'s public names: sorted, exported, shown at the public path."""

from __future__ import annotations

import subprocess
import sys

import leaseworker.testing


def test_all_is_sorted_and_every_name_is_exported_at_the_public_path() -> None:
    """A helper added without export (or exported from its private module's name) fails here."""
    names = leaseworker.testing.__all__
    assert list(names) == sorted(names)
    public = {n for n in dir(leaseworker.testing) if not n.startswith(("_", "@"))}  # @: pytest's
    assert public - {"pytest_plugin"} == set(names)
    for name in names:
        obj = getattr(leaseworker.testing, name)
        if isinstance(obj, type):
            assert obj.__module__ == "leaseworker.testing", name


def test_importing_the_kit_does_not_import_the_dev_services() -> None:
    """Only the pytest plugin reaches the development services (the import contract's exception)."""
    probe = "import sys, leaseworker.testing; print('leaseworker_dev' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "False"
