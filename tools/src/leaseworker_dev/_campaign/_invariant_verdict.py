"""One invariant's verdict: whether it held, its counts, the first violations in words.

Its own module so that the lease and the effect invariants (``_checker``,
``_effect_checks``) both build on it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from leaseworker.toolkit import Scalar

MAX_SHOWN = 20
"""Violations described per invariant; the counts cover all of them."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """One invariant's result: whether it held, its counts, what broke it."""

    name: str
    passed: bool
    counts: dict[str, Scalar] = field(default_factory=dict)
    violations: tuple[str, ...] = ()
    note: str = ""  # said instead of the counts when there was nothing to count ("no effects")

    def line(self) -> str:
        """``PASS name (count=n, ...)``, then one indented line per violation shown."""
        counts = self.note or ", ".join(f"{k}={_shown(v)}" for k, v in self.counts.items())
        head = f"{'PASS' if self.passed else 'FAIL'} {self.name} ({counts})"
        return "\n".join([head, *(f"    {v}" for v in self.violations)])


def verdict(name: str, counts: dict[str, Scalar], violations: list[str]) -> Verdict:
    """Return the verdict of ``name``: passed when ``violations`` is empty (the first shown)."""
    return Verdict(
        name=name,
        passed=not violations,
        counts=counts,
        violations=tuple(violations[:MAX_SHOWN]),
    )


def _shown(value: Scalar) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)
