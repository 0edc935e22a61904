"""The suite's own report at the end of a pytest run: where the wall time went.

Loaded by the repository's tests/conftest.py (not by the ``leaseworker`` plugin
users install): after pytest's ``--durations`` list it prints the wall time
per test directory, the sum of every test's setup, call and teardown there
(a session fixture's start counts where the first test that asked for it
sits), slowest first, with the number of tests in each.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

import pytest


@dataclass
class DirectoryTimes:
    """Wall time and test count per directory, from pytest's reports."""

    seconds: dict[str, float] = field(default_factory=dict)
    tests: dict[str, set[str]] = field(default_factory=dict)

    def add(self, nodeid: str, duration: float) -> None:
        """Count one phase (setup, call or teardown) of the test ``nodeid``."""
        directory = posixpath.dirname(nodeid.partition("::")[0]) or "."
        self.seconds[directory] = self.seconds.get(directory, 0.0) + duration
        self.tests.setdefault(directory, set()).add(nodeid)

    def rows(self) -> list[tuple[str, float, int]]:
        """Return (directory, seconds, tests) rows, the most time first."""
        return sorted(
            ((name, spent, len(self.tests[name])) for name, spent in self.seconds.items()),
            key=lambda row: (-row[1], row[0]),
        )

    def lines(self) -> list[str]:
        """Return the table as text lines, a total line last (none when nothing ran)."""
        rows = self.rows()
        if not rows:
            return []
        total = sum(spent for _, spent, _ in rows) or 1.0
        width = max(len("total"), *(len(name) for name, _, _ in rows))
        lines = [
            f"{name:<{width}}  {spent:9.2f}s  {spent / total:4.0%}  {count:5d} tests"
            for name, spent, count in rows
        ]
        tests = sum(count for _, _, count in rows)
        lines.append(f"{'total':<{width}}  {total:9.2f}s  100%  {tests:5d} tests")
        return lines


def pytest_configure(config: pytest.Config) -> None:
    """Register the session's report (its hooks below keep the table)."""
    config.pluginmanager.register(_SuiteReport(), "leaseworker-suite-report")


class _SuiteReport:
    """The hooks, around one session's table."""

    def __init__(self) -> None:
        self.times = DirectoryTimes()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Add each phase's duration to the directory of its test."""
        self.times.add(report.nodeid, report.duration)

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        """Print the table after pytest's own summaries (``--durations`` among them)."""
        lines = self.times.lines()
        if lines:
            terminalreporter.write_sep("=", "wall time per directory (setup + call + teardown)")
            for line in lines:
                terminalreporter.write_line(line)
