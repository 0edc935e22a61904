"""The suite's own report at the end of a pytest run: where the wall time went.

Loaded by the repository's tests/conftest.py (not by the ``leaseworker`` plugin
users install): after pytest's ``--durations`` list it prints the wall time
per test directory, the sum of every test's setup, call and teardown there
(a session fixture's start counts where the first test that asked for it
sits), slowest first, with the number of tests in each. Under pytest-repeat's
``--count N --repeat-scope session`` (``scripts/test.sh --repeat``) it also
says how many of the N runs passed: run k passed when no test failed in its
k-th repetition (pytest-repeat ends a repeated test's id with ``k-N]``).

Under pytest-xdist the controller gets every worker's reports and prints the
table; the directories' sums then exceed the run's wall time, and a last line
says how busy each worker was (the longest is the run's floor) and when, counted
from the session's start, its last test ended: the gap between the two is its
start-up and its waits for work, the gap to pytest's time the rest. ``--dist
loadgroup`` ends a grouped test's id with ``@group``, which the runs ignore.
"""

from __future__ import annotations

import posixpath
import re
import time
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


@dataclass
class RepeatedRuns:
    """Which of ``count`` repeated runs ran, and which had a failing test, from the tests' ids."""

    count: int
    seen: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)

    def add(self, nodeid: str, *, failed: bool) -> None:
        """Count one phase of ``nodeid`` in its run (ids without a repetition are not counted)."""
        step = re.search(rf"[\[-](\d+)-{self.count}\](@[^\]]*)?$", nodeid)
        if step is None:
            return
        run = int(step[1])
        self.seen.add(run)
        if failed:
            self.failed.add(run)

    def verdict(self) -> str:
        """Say how many runs passed, and which failed."""
        if not self.seen:
            return f"repeat: no test ran {self.count} times"
        passed = len(self.seen - self.failed)
        failing = ", ".join(str(run) for run in sorted(self.failed))
        return f"repeat: {passed} of {self.count} runs passed" + (
            f" (failed: run {failing})" if failing else ""
        )


def pytest_configure(config: pytest.Config) -> None:
    """Register the session's report (its hooks keep the table and the runs)."""
    count = config.getoption("count", 1)  # pytest-repeat's option, when it is installed
    config.pluginmanager.register(_SuiteReport(count), "leaseworker-suite-report")


def worker_line(busy: dict[str, float], done: dict[str, float] | None = None) -> str:
    """Say how long each xdist worker ran tests (``gw0``, ``gw1``, ... in order).

    ``done``: when its last test ended, seconds after the session started.
    """
    order = sorted(busy, key=lambda name: (len(name), name))
    ended = done or {}
    return f"{len(busy)} workers busy: " + ", ".join(
        f"{name} {busy[name]:.0f}s" + (f" of {ended[name]:.0f}s" if name in ended else "")
        for name in order
    )


class _SuiteReport:
    """The hooks, around one session's table."""

    def __init__(self, count: int) -> None:
        self.times = DirectoryTimes()
        self.runs = RepeatedRuns(count)
        self.workers: dict[str, float] = {}
        self.done: dict[str, float] = {}
        self.started = time.time()

    def pytest_sessionstart(self) -> None:
        """Count the workers' ends from here (pytest's reports carry the epoch's time)."""
        self.started = time.time()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Add each phase's duration to the directory of its test, and its outcome to its run."""
        self.times.add(report.nodeid, report.duration)
        self.runs.add(report.nodeid, failed=report.failed)
        worker = getattr(report, "worker_id", None)  # pytest-xdist's, on the controller
        if worker is not None:
            self.workers[str(worker)] = self.workers.get(str(worker), 0.0) + report.duration
            self.done[str(worker)] = max(
                self.done.get(str(worker), 0.0), report.stop - self.started
            )

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        """Print the table after pytest's own summaries (``--durations`` among them)."""
        lines = self.times.lines()
        if lines:
            terminalreporter.write_sep("=", "wall time per directory (setup + call + teardown)")
            for line in lines:
                terminalreporter.write_line(line)
            if self.workers:
                terminalreporter.write_line(worker_line(self.workers, self.done))
        if self.runs.count > 1:
            terminalreporter.write_sep("=", self.runs.verdict())
