"""The history model: documents and record files read back as written, overlaps measured."""

from __future__ import annotations

import pytest

from leaseworker._history import (
    Execution,
    FaultWindow,
    History,
    Step,
    header_line,
    merge,
    record_line,
)


def _execution(pod: str, start: float, end: float | None, fence: int) -> Execution:
    return Execution(
        job_key="k",
        execution_id=f"{pod}-{fence}",
        pod=pod,
        start=start,
        end=end,
        fence=fence,
        steps=(
            Step(at=start, name="acquired"),
            Step(at=start + 1, name="lost", attrs={"reason": "late"}),
        ),
    )


def test_a_document_reads_back_as_written() -> None:
    """Executions, steps and faults survive a round trip."""
    history = History(
        executions=(_execution("a", 0.0, 5.0, 1), _execution("b", 4.0, None, 2)),
        faults=(FaultWindow(kind="pause", start=1.0, end=3.0, target="a"),),
    )
    assert History.from_json(history.to_json()) == history


def test_a_record_file_reads_as_the_history_it_recorded() -> None:
    """Lines appended by a recorder read as one history."""
    first, second = _execution("a", 0.0, 1.0, 1), _execution("a", 2.0, 3.0, 2)
    fault = FaultWindow(kind="kill", start=1.5, target="a")
    text = header_line("monotonic") + record_line(first) + record_line(fault) + record_line(second)
    assert History.from_json(text) == History(
        clock="monotonic", executions=(first, second), faults=(fault,)
    )


@pytest.mark.parametrize(
    "text",
    [
        '{"format": "other/1", "clock": "unix"}',
        '{"format": "leaseworker.history/1", "clock": "tai"}',
    ],
)
def test_a_foreign_document_is_refused(text: str) -> None:
    """Another format or an unknown clock is refused by name."""
    with pytest.raises(ValueError, match=r"history/1 document|clock"):
        History.from_json(text)


def test_overlap_counts_an_open_end_as_running() -> None:
    """An execution without an end overlaps until the given time."""
    a, b = _execution("a", 0.0, 5.0, 1), _execution("b", 4.0, None, 2)
    assert a.overlaps(b, until=10.0) == pytest.approx(1.0)
    assert _execution("c", 6.0, 7.0, 3).overlaps(a, until=10.0) == 0.0


def test_merge_refuses_mixed_clocks_and_keeps_order_of_keys() -> None:
    """Merging needs one clock; keys come in order of first execution."""
    one = History(executions=(_execution("a", 0.0, 1.0, 1),))
    with pytest.raises(ValueError, match="different clocks"):
        merge([one, History(clock="monotonic")])
    both = merge(
        [one, History(executions=(Execution(job_key="j", execution_id="x", pod="p", start=-1.0),))]
    )
    assert both.keys() == ["j", "k"]
    assert both.of_key("k").executions == one.executions


def test_a_later_line_of_an_execution_replaces_its_start_line() -> None:
    """A recorder's start line, then the ended execution: one execution, the ended one."""
    started = Execution(job_key="k", execution_id="e1", pod="p", start=1.0, fence=3)
    ended = Execution(job_key="k", execution_id="e1", pod="p", start=1.0, end=2.0, fence=3)
    killed = Execution(job_key="k", execution_id="e2", pod="p", start=3.0, fence=4)
    text = header_line("monotonic") + record_line(started) + record_line(killed)
    history = History.from_json(text + record_line(ended))
    assert history.executions == (ended, killed)


def test_overlapping_pairs_one_keys_executions_that_held_it_at_once() -> None:
    """The one overlap judgement: same key, intervals that intersect, an open end until the end.

    Touching intervals (one stops as the next starts) and other keys' executions do not count.
    """
    a = _execution("pod-a", 0.0, 5.0, 1)
    b = _execution("pod-b", 4.0, 6.0, 2)  # overlaps a by 1 s
    c = _execution("pod-c", 6.0, None, 3)  # starts as b stops: no overlap; open-ended
    d = _execution("pod-d", 7.0, 8.0, 4)  # inside c's open end
    other = Execution(job_key="other", execution_id="x", pod="pod-a", start=4.5, end=9.0)
    history = History(executions=(d, c, other, b, a))
    assert history.end == 9.0
    assert [(p.execution_id, q.execution_id) for p, q in history.overlapping()] == [
        ("pod-a-1", "pod-b-2"),
        ("pod-c-3", "pod-d-4"),
    ]
    assert history.overlapping(until=7.0) == [(a, b)]  # c's open end counted to 7 only


def test_a_reader_skips_execution_fields_a_newer_writer_added() -> None:
    """A history file from a newer pod (a field this version does not know) still reads."""
    header = '{"format": "leaseworker.history/1", "clock": "monotonic"}\n'
    line = '{"execution":{"job_key":"k","execution_id":"e1","pod":"p","start":1.0,"shiny_new":3}}\n'
    [execution] = History.from_json(header + line).executions
    assert (execution.job_key, execution.execution_id, execution.start) == ("k", "e1", 1.0)
