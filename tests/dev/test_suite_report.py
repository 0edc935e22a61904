"""The suite's report: wall time per test directory, summed from pytest's reports."""

from __future__ import annotations

import pytest

from leaseworker_dev._suite_report import DirectoryTimes, RepeatedRuns, worker_line


def test_phases_add_up_per_directory_and_tests_are_counted_once() -> None:
    """Setup, call and teardown of one test add up; a directory counts each test once."""
    times = DirectoryTimes()
    for phase in (0.5, 2.0, 0.25):  # one test's setup, call and teardown
        times.add("tests/lease/test_hold.py::test_a", phase)
    times.add("tests/lease/test_lease.py::test_b[1-3]", 1.0)
    times.add("tests/store/test_x.py::TestY::test_c", 4.0)
    times.add("tests/test_docs.py::test_d", 0.5)
    assert times.rows() == [
        ("tests/store", 4.0, 1),
        ("tests/lease", 3.75, 2),
        ("tests", 0.5, 1),
    ]
    assert times.lines()[-1].split() == ["total", "8.25s", "100%", "4", "tests"]


def test_nothing_ran_prints_nothing() -> None:
    """No report, no table (not a lone total of zero)."""
    assert DirectoryTimes().lines() == []


def test_the_table_ends_the_run(pytester: pytest.Pytester) -> None:
    """With the plugin loaded, a run ends with one row per directory, after --durations."""
    pytester.makepyfile(
        **{
            "slow/test_one.py": "import time\ndef test_one():\n    time.sleep(0.2)\n",
            "fast/test_two.py": "def test_two():\n    pass\ndef test_three():\n    pass\n",
        }
    )
    result = pytester.runpytest(
        "-p", "leaseworker_dev._suite_report", "-p", "no:asyncio", "-p", "no:cacheprovider",
        "--durations=3",
    )  # fmt: skip
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "*slowest 3 durations*",
            "*wall time per directory (setup + call + teardown)*",
            "slow  *0.2?s  *%      1 tests",  # slowest first; shares depend on the machine
            "fast  *0.??s  *%      2 tests",
            "total *0.2?s  100%      3 tests",
        ]
    )


def test_a_run_passes_when_none_of_its_repetitions_failed() -> None:
    """Run k is every test id ending in k-N]; one failing phase fails the run."""
    runs = RepeatedRuns(3)
    for run in (1, 2, 3):
        runs.add(f"tests/a.py::test_x[{run}-3]", failed=False)
        runs.add(f"tests/a.py::test_y[param-{run}-3]", failed=run == 2)
    runs.add("tests/a.py::test_unrepeated", failed=True)  # not one of the runs
    assert runs.verdict() == "repeat: 2 of 3 runs passed (failed: run 2)"
    assert RepeatedRuns(3).verdict() == "repeat: no test ran 3 times"


def test_repeated_runs_are_counted_at_the_end(pytester: pytest.Pytester) -> None:
    """Under pytest-repeat's --count, the run ends saying which runs passed."""
    pytester.makepyfile(
        test_flaky="""
        import itertools
        calls = itertools.count(1)

        def test_steady():
            pass

        def test_fails_its_second_time():
            assert next(calls) != 2
        """
    )
    result = pytester.runpytest(
        "-p", "leaseworker_dev._suite_report", "-p", "no:asyncio", "-p", "no:cacheprovider",
        "--count", "3", "--repeat-scope", "session",
    )  # fmt: skip
    result.assert_outcomes(passed=5, failed=1)
    result.stdout.fnmatch_lines(["*repeat: 2 of 3 runs passed (failed: run 2)*"])


def test_a_grouped_test_counts_in_its_run_and_workers_are_listed_in_order() -> None:
    """``--dist loadgroup``'s ``@group`` suffix keeps a test in its run; gw10 comes after gw2."""
    runs = RepeatedRuns(2)
    runs.add("tests/a.py::test_x[1-2]@sentinel", failed=False)
    runs.add("tests/a.py::test_x[2-2]@sentinel", failed=True)
    assert runs.verdict() == "repeat: 1 of 2 runs passed (failed: run 2)"
    line = worker_line({"gw10": 1.0, "gw2": 2.4, "gw0": 3.0})
    assert line == "3 workers busy: gw0 3s, gw2 2s, gw10 1s"
    line = worker_line({"gw1": 2.4, "gw0": 3.0}, done={"gw0": 4.2, "gw1": 5.6})
    assert line == "2 workers busy: gw0 3s of 4s, gw1 2s of 6s"


def test_under_xdist_the_controller_prints_the_table(pytester: pytest.Pytester) -> None:
    """The workers' reports reach the controller: one table for the run, then the workers."""
    pytester.makepyfile(
        **{
            "one/test_one.py": "def test_one():\n    pass\n",
            "two/test_two.py": "def test_two():\n    pass\ndef test_three():\n    pass\n",
        }
    )
    result = pytester.runpytest_subprocess(
        "-p", "leaseworker_dev._suite_report", "-p", "no:asyncio", "-p", "no:cacheprovider",
        "-n", "2",
    )  # fmt: skip
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "*wall time per directory (setup + call + teardown)*",
            "total *100%      3 tests",
            "* workers busy: gw*s of *s*",
        ]
    )
