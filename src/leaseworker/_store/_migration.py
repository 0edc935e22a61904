"""One versioned schema step, with its DDL per dialect (see :mod:`._schema`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Migration:
    """One schema step: its version, a description, and its DDL per dialect."""

    version: int
    description: str
    postgresql: tuple[str, ...]
    sqlite: tuple[str, ...]
