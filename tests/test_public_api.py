"""The public API is exactly what ``leaseworker.__all__`` names, from one place."""

from __future__ import annotations

import leaseworker


def test_all_is_sorted_and_every_name_is_exported() -> None:
    """A public name added without export (or exported without listing) fails here."""
    names = leaseworker.__all__
    assert list(names) == sorted(names)
    for name in names:
        assert hasattr(leaseworker, name), name
    # "@py_builtins" & co.: pytest rewrites the asserts of a package with a pytest11 plugin.
    public = {n for n in dir(leaseworker) if not n.startswith(("_", "@"))} - {"testing", "effects"}
    assert public == {n for n in names if not n.startswith("_")}


def test_exported_classes_show_the_public_module_path() -> None:
    """Reprs and docs name ``leaseworker.X``, not the private module."""
    for name in leaseworker.__all__:
        obj = getattr(leaseworker, name)
        if isinstance(obj, type):
            assert obj.__module__ == "leaseworker", name


def test_exception_tree_is_rooted_at_leaseworker_error() -> None:
    """Every exception leaseworker exports derives from LeaseworkerError."""
    for name in leaseworker.__all__:
        obj = getattr(leaseworker, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            assert issubclass(obj, leaseworker.LeaseworkerError), name
