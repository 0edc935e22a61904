"""Old public names that still work for a release: each use warns once per call site.

Issue 26 gave each concept one name (docs/design.md#vocabulary). A public name
users code against (a keyword of ``hold()``, a class, a CLI flag) keeps its old
spelling here, warning with :class:`DeprecationWarning`, so upgrading breaks no
caller silently and every alias warns alike.
"""

from __future__ import annotations

import warnings
from typing import TypeVar

T = TypeVar("T")


def renamed(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that ``old`` is now called ``new`` (``stacklevel`` points at the caller's caller)."""
    warnings.warn(f"{old} is deprecated; use {new}", DeprecationWarning, stacklevel=stacklevel)


def keyword(
    where: str, old: str, old_value: T | None, new: str, new_value: T | None, *, stacklevel: int = 4
) -> T | None:
    """Return ``new_value``, or ``old_value`` with a warning when only the old keyword was given.

    ``stacklevel`` 4 points the warning at whoever called the function that called this.
    """
    if old_value is None:
        return new_value
    if new_value is not None:
        raise TypeError(f"{where}: give {new}= only ({old}= is its deprecated spelling)")
    renamed(f"{where}: {old}=", f"{new}=", stacklevel=stacklevel)
    return old_value
