"""The checker fails on each kind of violation, and passes a clean history.

Each test starts from one consistent history (two executions of a key handing
over, a completion, its trigger committed) and breaks one thing: a checker that
cannot fail is a defect.
"""

from __future__ import annotations

import dataclasses

import pytest

from leaseworker._history import Step
from leaseworker.toolkit import Execution, FaultWindow, History
from leaseworker_dev._campaign import Marked, PodExit, Produced, Records, Stored, Verdict, check

KEY = "report:acme:2026-11"


def _execution(
    eid: str, pod: str, start: float, end: float | None, fence: int, **more: object
) -> Execution:
    fields: dict[str, object] = {
        "job_key": KEY,
        "execution_id": eid,
        "pod": pod,
        "start": start,
        "end": end,
        "fence": fence,
        "input_version": "v1",
        "partition": 0,
        "offset": 0,
        **more,
    }
    return Execution(**fields)  # type: ignore[arg-type]


def _lost(eid: str, pod: str, start: float, end: float, fence: int, margin: float) -> Execution:
    stopped = Step(at=end, name="stopped", attrs={"latency_ms": 12.0, "margin_ms": margin})
    return _execution(
        eid, pod, start, end, fence, outcome="lost", reason="deadline", steps=(stopped,)
    )


def _completed(eid: str, pod: str, start: float, end: float, fence: int, status: str) -> Execution:
    step = Step(at=end - 0.1, name="completion", duration=0.05, attrs={"status": status})
    return _execution(
        eid, pod, start, end, fence, outcome="completed", completion=status, steps=(step,)
    )


CLEAN = History(
    clock="monotonic",
    executions=(
        _lost("a", "pod-a", 0.0, 5.0, 10, margin=900.0),
        _completed("b", "pod-b", 6.0, 9.0, 11, "accepted"),
    ),
)
RECORDS = Records(
    produced=(Produced(partition=0, offset=0, job_key=KEY, input_version="v1"),),
    committed={0: 1},
    completions={(KEY, "v1"): Stored(fence=11, execution_id="b")},
    exits=(PodExit(pod="pod-a", code=0), PodExit(pod="pod-b", code=0)),
)


def _failed(history: History, records: Records = RECORDS) -> dict[str, Verdict]:
    return {v.name: v for v in check(history, records) if not v.passed}


def test_a_clean_history_passes_every_invariant() -> None:
    """The baseline the other tests break: nothing fails, the loss figures are reported."""
    verdicts = {v.name: v for v in check(CLEAN, RECORDS)}
    assert all(v.passed for v in verdicts.values()), [v.line() for v in verdicts.values()]
    losses = verdicts["every loss stopped before Redis could expire the key"].counts
    assert losses["losses"] == 1
    assert losses["min_margin_ms"] == 900.0


def test_an_overlap_fails() -> None:
    """The second execution acquires before the first stopped."""
    overlapping = dataclasses.replace(CLEAN.executions[1], start=4.0)
    failed = _failed(dataclasses.replace(CLEAN, executions=(CLEAN.executions[0], overlapping)))
    assert list(failed) == ["no two executions of one key at once"]
    assert "overlapped 1000 ms" in failed["no two executions of one key at once"].violations[0]


def test_an_overlap_with_a_paused_execution_is_counted_apart() -> None:
    """A frozen pod's execution is fencing's job: counted as paused, not a violation."""
    paused = dataclasses.replace(CLEAN.executions[0], paused=True, end=7.0)
    verdicts = check(dataclasses.replace(CLEAN, executions=(paused, CLEAN.executions[1])), RECORDS)
    assert verdicts[0].passed
    assert verdicts[0].counts["paused_overlaps"] == 1


def test_an_overlap_across_redis_restarted_empty_is_the_documented_limit() -> None:
    """Redis forgot the lease: counted as a data-loss overlap, not a violation."""
    running = dataclasses.replace(CLEAN.executions[0], end=7.0)
    fault = FaultWindow(kind="redis_restart_empty", start=2.0, end=2.5)
    history = History(clock="monotonic", executions=(running, CLEAN.executions[1]), faults=(fault,))
    verdicts = check(history, RECORDS)
    assert verdicts[0].passed
    assert verdicts[0].counts["data_loss_overlaps"] == 1


@pytest.mark.parametrize(("first_end", "counted_apart"), [(6.9, True), (7.1, False)])
def test_an_overlap_after_a_clock_step_is_allowed_only_within_its_bound(
    first_end: float, counted_apart: bool
) -> None:
    """A forward step of Redis's clock at 5.0 with a 2 s bound: the first may run until 7.0.

    Its second acquires at once (4.5 would be before the step: not explained).
    """
    running = dataclasses.replace(CLEAN.executions[0], end=first_end)
    second = dataclasses.replace(CLEAN.executions[1], start=5.2)
    attrs = {"step_s": 6.0, "overlap_bound_s": 2.0}
    fault = FaultWindow(kind="redis_clock_step", start=5.0, end=5.0, attrs=attrs)
    history = History(clock="monotonic", executions=(running, second), faults=(fault,))
    overlaps = check(history, RECORDS)[0]
    assert overlaps.passed is counted_apart
    assert overlaps.counts["clock_step_overlaps"] == int(counted_apart)
    assert overlaps.counts["overlaps"] == int(not counted_apart)
    early = dataclasses.replace(second, start=4.5)
    before = History(clock="monotonic", executions=(running, early), faults=(fault,))
    assert check(before, RECORDS)[0].counts["overlaps"] == 1


def test_an_open_ended_execution_overlaps_everything_after_it() -> None:
    """An execution whose end was never recorded counts as running to the history's end."""
    open_ended = dataclasses.replace(CLEAN.executions[0], end=None)
    failed = _failed(dataclasses.replace(CLEAN, executions=(open_ended, CLEAN.executions[1])))
    assert "no two executions of one key at once" in failed


def test_a_fence_inversion_fails() -> None:
    """A later acquisition with a lower fence."""
    inverted = dataclasses.replace(CLEAN.executions[1], fence=9)
    records = dataclasses.replace(
        RECORDS, completions={(KEY, "v1"): Stored(fence=9, execution_id="b")}
    )
    failed = _failed(
        dataclasses.replace(CLEAN, executions=(CLEAN.executions[0], inverted)), records
    )
    assert "fences strictly increase per key" in failed
    assert (
        "fence 9 after a had fence 10" in failed["fences strictly increase per key"].violations[0]
    )


def test_a_stale_write_accepted_fails() -> None:
    """A paused execution's lower fence accepted after a newer one showed the store its fence."""
    newer = _completed("b", "pod-b", 6.0, 9.0, 11, "stale")
    late = _completed("a", "pod-a", 0.0, 12.0, 10, "accepted")
    history = History(clock="monotonic", executions=(dataclasses.replace(late, paused=True), newer))
    records = dataclasses.replace(
        RECORDS, completions={(KEY, "v1"): Stored(fence=10, execution_id="a")}
    )
    failed = _failed(history, records)
    assert list(failed) == ["one completion per identity, highest fence, none stale"]
    text = "\n".join(failed["one completion per identity, highest fence, none stale"].violations)
    assert "accepted fence 10, but fence 11 attempted it" in text
    assert "accepted after b had shown fence 11" in text


def test_two_accepted_completions_of_one_identity_fail() -> None:
    """The store accepted the same identity twice."""
    twice = _completed("a", "pod-a", 0.0, 5.0, 10, "accepted")
    history = dataclasses.replace(CLEAN, executions=(twice, CLEAN.executions[1]))
    failed = _failed(history)
    assert (
        "2 completions accepted"
        in failed["one completion per identity, highest fence, none stale"].violations[0]
    )


def test_the_store_disagreeing_with_the_history_fails() -> None:
    """The store holds another execution's completion than the one the history says won."""
    records = dataclasses.replace(
        RECORDS, completions={(KEY, "v1"): Stored(fence=11, execution_id="x")}
    )
    assert "one completion per identity, highest fence, none stale" in _failed(CLEAN, records)


@pytest.mark.parametrize(
    "records",
    [
        dataclasses.replace(RECORDS, committed={0: 0}),  # the offset was never committed
        dataclasses.replace(RECORDS, completions={}),  # nothing completed, nothing dead-lettered
    ],
    ids=["uncommitted", "never completed"],
)
def test_a_lost_trigger_fails(records: Records) -> None:
    """A trigger whose offset was not committed, or whose identity never finished."""
    assert list(_failed(CLEAN, records)) == ["every trigger committed, every identity done"]


def test_a_crashed_pod_fails_and_a_killed_one_does_not() -> None:
    """A non-zero exit the campaign did not cause is a crash."""
    crashed = dataclasses.replace(RECORDS, exits=(PodExit(pod="pod-a", code=1),))
    assert list(_failed(CLEAN, crashed)) == ["no pod exited non-zero unless killed"]
    killed = dataclasses.replace(RECORDS, exits=(PodExit(pod="pod-a", code=-9, killed=True),))
    assert _failed(CLEAN, killed) == {}


def test_a_loss_that_stopped_after_redis_could_expire_fails() -> None:
    """A negative margin: the body ran on after the key could have gone to another pod."""
    late = _lost("a", "pod-a", 0.0, 5.0, 10, margin=-40.0)
    failed = _failed(dataclasses.replace(CLEAN, executions=(late, CLEAN.executions[1])))
    assert list(failed) == ["every loss stopped before Redis could expire the key"]


def test_a_paused_loss_is_counted_apart_from_the_figures() -> None:
    """A frozen execution's late stop is fencing's case: not a violation, not in the figures."""
    late = dataclasses.replace(_lost("a", "pod-a", 0.0, 5.0, 10, margin=-40.0), paused=True)
    verdicts = check(dataclasses.replace(CLEAN, executions=(late,)), RECORDS)
    [verdict] = [v for v in verdicts if v.name.startswith("every loss stopped")]
    assert verdict.passed
    assert (verdict.counts["losses"], verdict.counts["paused_losses"]) == (0, 1)


CODE_AFTER_STOP = "no process of an execution ran after it stopped"


def _marks(eid: str, last: float, pid: int = 4242) -> Marked:
    return Marked(execution_id=eid, pid=pid, count=100, first=0.5, last=last)


def test_marks_before_each_stop_pass_and_are_counted() -> None:
    """A lost execution's child marked until 4.99 s (it stopped at 5.0): the margin is reported."""
    records = dataclasses.replace(RECORDS, marks=(_marks("a", 4.99), _marks("b", 8.0, pid=7)))
    verdicts = {v.name: v for v in check(CLEAN, records)}
    assert verdicts[CODE_AFTER_STOP].passed
    counts = verdicts[CODE_AFTER_STOP].counts
    assert (counts["executions"], counts["processes"], counts["marks"]) == (2, 2, 200)
    assert counts["min_margin_ms"] == 10.0


def test_a_child_that_ran_after_its_execution_stopped_fails() -> None:
    """The planted violation: a mark 200 ms after the recorded stop, and 1.2 s into the next."""
    records = dataclasses.replace(RECORDS, marks=(_marks("a", 6.2),))
    failed = _failed(CLEAN, records)
    assert list(failed) == [CODE_AFTER_STOP]
    text = "\n".join(failed[CODE_AFTER_STOP].violations)
    assert "process 4242 ran 1200 ms after the execution ended (lost)" in text
    assert "ran 200 ms into b (pod-b, fence 11)" in text


def test_a_paused_execution_is_no_excuse_for_its_child() -> None:
    """A frozen pod's child must kill itself at its deadline: a mark into the next one fails."""
    paused = dataclasses.replace(CLEAN.executions[0], paused=True, end=7.0)
    history = dataclasses.replace(CLEAN, executions=(paused, CLEAN.executions[1]))
    records = dataclasses.replace(RECORDS, marks=(_marks("a", 6.5),))
    failed = _failed(history, records)
    assert CODE_AFTER_STOP in failed
    assert "ran 500 ms into b" in failed[CODE_AFTER_STOP].violations[0]


def test_a_killed_pods_processes_get_the_death_grace_and_no_more() -> None:
    """Ended by its pod's SIGKILL at 5.0: marks until 5.9 pass, one at 6.1 fails."""
    killed = dataclasses.replace(CLEAN.executions[0], outcome="killed", steps=())
    history = dataclasses.replace(
        CLEAN,
        executions=(killed, dataclasses.replace(CLEAN.executions[1], start=9.0, end=10.0)),
    )
    within = dataclasses.replace(RECORDS, marks=(_marks("a", 5.9),))
    assert CODE_AFTER_STOP not in _failed(history, within)
    beyond = dataclasses.replace(RECORDS, marks=(_marks("a", 6.1),))
    assert (
        "ran 1100 ms after the execution ended (killed)"
        in (_failed(history, beyond)[CODE_AFTER_STOP].violations[0])
    )


def test_a_child_running_into_the_next_execution_across_redis_emptied_is_the_limit() -> None:
    """Redis forgot the lease: the next start is not a violation (the own end still is)."""
    running = dataclasses.replace(CLEAN.executions[0], end=7.0)
    fault = FaultWindow(kind="redis_restart_empty", start=2.0, end=2.5)
    history = History(clock="monotonic", executions=(running, CLEAN.executions[1]), faults=(fault,))
    records = dataclasses.replace(RECORDS, marks=(_marks("a", 6.5),))
    verdicts = {v.name: v for v in check(history, records)}
    assert verdicts[CODE_AFTER_STOP].passed
