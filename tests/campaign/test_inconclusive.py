"""A campaign that barely exercised the job is inconclusive: exit 1, one line, never PASS.

Issue 28's reproduction: a job whose ``job_key`` reads ``payload["customer"]``
run with the default trigger generator had its 52 triggers dead-lettered, ran
0 executions, and every check printed PASS. Its history is planted here and
judged as the campaign judges it; then the command's verdict and exit code,
with the campaign itself replaced by that result.
"""

from __future__ import annotations

import pytest

from leaseworker._cli import main
from leaseworker.toolkit import Execution, FaultWindow, History
from leaseworker_dev._campaign import (
    DeadLetter,
    Produced,
    Records,
    Settings,
    check,
    render,
    to_json,
)
from leaseworker_dev._campaign._campaign_run import Result
from leaseworker_dev._campaign._exercise import exercise
from leaseworker_dev._campaign._payloads import default_payloads
from leaseworker_dev._campaign._plan import Plan

from ..jobs import MarkerJob

REASON = "no_job_key: payload needs a string 'customer'"
DEAD = Records(
    produced=tuple(
        Produced(partition=n % 6, offset=n // 6, job_key="", input_version="") for n in range(52)
    ),
    committed=dict.fromkeys(range(6), 9),
    dead_letters=tuple(
        DeadLetter(partition=n % 6, offset=n // 6, reason=REASON) for n in range(52)
    ),
)
FAULTS = tuple(
    FaultWindow(kind="pod_kill", start=float(n), end=float(n), target="pod-1") for n in range(20)
)


def _result(history: History, records: Records) -> Result:
    settings = Settings(job="shop:InvoiceJob", job_class=MarkerJob, payloads=default_payloads)
    return Result(
        settings=settings,
        plan=Plan(seed=1, faults=(), triggers=()),
        history=history,
        records=records,
        verdicts=check(history, records),
        skipped=0,
        store="sqlite",
        wall=60.0,
        exercised=exercise(history, records, keys=settings.keys, payloads=None),
    )


def test_every_trigger_dead_lettered_is_inconclusive_and_points_at_payloads() -> None:
    """Every check passes vacuously; the result is INCONCLUSIVE and names --payloads."""
    result = _result(History(clock="monotonic", faults=FAULTS), DEAD)
    assert all(v.passed for v in result.verdicts)
    assert not result.ok
    reason = result.inconclusive
    assert reason is not None
    assert "0 executions (at least 8), 0 completions (at least 4)" in reason
    assert "0 faults that hit a running execution (at least 2)" in reason
    assert "52 of 52 triggers were dead-lettered (no_job_key: " in reason
    assert "the default trigger generator does not fit the job" in reason
    assert "give --payloads pkg.module:function" in reason
    shown = render(result)
    assert "  exercised      0 executions, 0 completions, 0 of 20 faults" in shown
    assert shown.splitlines()[-1] == f"  result         INCONCLUSIVE: {reason}"
    assert '"inconclusive": "the campaign barely exercised the job' in to_json(result)


def _ran(key: str, pod: str, start: float, end: float, fence: int) -> Execution:
    return Execution(
        job_key=key,
        execution_id=f"e{fence}",
        pod=pod,
        start=start,
        end=end,
        fence=fence,
        input_version="v0",
        outcome="completed",
        completion="accepted",
    )


def test_enough_executions_completions_and_hits_are_conclusive() -> None:
    """Eight keys completed, and the faults struck pods while they ran: no verdict withheld."""
    executions = tuple(_ran(f"k{n}", "pod-1", n * 2.0, n * 2.0 + 1.5, n + 1) for n in range(8))
    result = _result(History(clock="monotonic", executions=executions, faults=FAULTS), Records())
    assert result.exercised is not None
    assert result.inconclusive is None, result.inconclusive
    assert result.exercised.hits == 16  # the kills at 0..15 s struck a run, those at 16..19 none
    assert "dead-lettered" not in render(result)


def test_faults_that_struck_only_idle_pods_are_inconclusive_without_blaming_the_payloads() -> None:
    """The executions ran on pod-2 only: no fault on pod-1 hit one, and shared faults none."""
    executions = tuple(_ran(f"k{n}", "pod-2", 100.0 + n, 100.5 + n, n + 1) for n in range(8))
    result = _result(History(clock="monotonic", executions=executions, faults=FAULTS), Records())
    assert result.inconclusive == (
        "the campaign barely exercised the job: 0 faults that hit a running execution (at least 2)"
    )


def test_the_command_exits_1_with_one_line_when_inconclusive(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``leaseworker chaos`` prints the report, then one ``inconclusive:`` line on stderr."""
    result = _result(History(clock="monotonic", faults=FAULTS), DEAD)
    monkeypatch.setattr("leaseworker_dev._campaign.run_campaign", lambda settings, out: result)
    assert main(["chaos", "tests.jobs:MarkerJob", "--faults", "20"]) == 1
    captured = capsys.readouterr()
    assert "PASS no two executions of one key at once" in captured.out
    [line] = captured.err.strip().splitlines()
    assert line == f"leaseworker chaos: inconclusive: {result.inconclusive}"
