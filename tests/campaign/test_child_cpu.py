"""The campaign report sums its executions' child CPU: what committed, and what was wasted.

A planted history judged as the campaign judges it: executions that ran
``run_in_process`` children, some committed, some lost, stale or cut short by
a pod kill, and one that ran no child.
"""

from __future__ import annotations

import json

from leaseworker.toolkit import Execution, History
from leaseworker_dev._campaign import Records, Settings, check, render, to_json
from leaseworker_dev._campaign._campaign_run import Result
from leaseworker_dev._campaign._payloads import default_payloads
from leaseworker_dev._campaign._plan import Plan

from ..jobs import MarkerJob


def _ran(fence: int, outcome: str | None, completion: str | None, cpu: float | None) -> Execution:
    return Execution(
        job_key=f"k{fence}",
        execution_id=f"e{fence}",
        pod="pod-1",
        start=float(fence),
        end=None if outcome is None else fence + 0.5,
        fence=fence,
        input_version="v0",
        outcome=outcome,
        completion=completion,
        cpu_seconds=cpu,
    )


def _result(*executions: Execution) -> Result:
    history = History(clock="monotonic", executions=executions)
    return Result(
        settings=Settings(
            job="chaos_job:CrunchReport", job_class=MarkerJob, payloads=default_payloads
        ),
        plan=Plan(seed=1, faults=(), triggers=()),
        history=history,
        records=Records(),
        verdicts=check(history, Records()),
        skipped=0,
        store="sqlite",
        wall=60.0,
    )


def test_the_cpu_of_executions_that_did_not_commit_is_one_number_by_outcome() -> None:
    """Committed 3.5 s; wasted 2.25 s in three executions: lost, stale, open-ended (a kill)."""
    result = _result(
        _ran(1, "completed", "accepted", 1.5),
        _ran(2, "completed", "accepted", 2.0),
        _ran(3, "lost", None, 1.0),
        _ran(4, "lost", "stale", 0.75),
        _ran(5, None, None, 0.5),
        _ran(6, "completed", "accepted", None),  # ran no child: not counted
    )
    document = json.loads(to_json(result))["child_cpu"]
    assert document == {
        "executions": 5,
        "committed_seconds": 3.5,
        "wasted_seconds": 2.25,
        "wasted_executions": 3,
        "wasted_by_outcome": {"lost": 1.0, "open-ended": 0.5, "stale": 0.75},
    }
    (line,) = [line for line in render(result).splitlines() if "child CPU" in line]
    assert line == (
        "  child CPU      3.5s committed, 2.2s in 3 executions that did not commit "
        "(lost 1.0s, open-ended 0.5s, stale 0.8s)"
    )


def test_a_campaign_whose_executions_ran_no_child_says_nothing_of_cpu() -> None:
    """No line, and ``null`` in the document."""
    result = _result(_ran(1, "completed", "accepted", None))
    assert json.loads(to_json(result))["child_cpu"] is None
    assert "child CPU" not in render(result)
