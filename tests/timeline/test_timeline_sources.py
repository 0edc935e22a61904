"""Where a timeline comes from: saved Jaeger answers, recorded histories, the command's errors.

A recorded history (what the fault campaign writes) and a saved Jaeger
answer (classic ``data`` or OTLP ``resourceSpans``) render through the same
``leaseworker timeline --from`` as a live search; bad input exits 2 with
one line, nothing found exits 1.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from leaseworker._cli import duration, main
from leaseworker._timeline import (
    JaegerError,
    JaegerQuery,
    history_from_spans,
    render_html,
    spans_from_document,
)
from leaseworker.testing import Step
from leaseworker.toolkit import Execution, FaultWindow, History, header_line, record_line

from .spansets import KEY, T0, loss_and_takeover


def _v1_document() -> dict[str, object]:
    """The classic API's answer holding the loss-and-takeover spans (µs, typed tags)."""
    spans = []
    for span in loss_and_takeover():
        tags = [{"key": k, "type": _v1_type(v), "value": v} for k, v in span.attributes.items()]
        if span.error:
            tags.append({"key": "otel.status_code", "type": "string", "value": "ERROR"})
        spans.append(
            {
                "traceID": span.trace_id,
                "spanID": span.span_id,
                "operationName": span.name,
                "references": [],
                "startTime": round(span.start * 1e6),
                "duration": round((span.end - span.start) * 1e6),
                "tags": tags,
                "processID": "p1",
            }
        )
    return {"data": [{"spans": spans, "processes": {"p1": {"serviceName": "leaseworker"}}}]}


def _v1_type(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64"
    return "float64" if isinstance(value, float) else "string"


def _otlp_document() -> dict[str, object]:
    """The v3 API's answer (OTLP/JSON) holding the same spans."""

    def value(v: object) -> dict[str, object]:
        if isinstance(v, bool):
            return {"boolValue": v}
        if isinstance(v, int):
            return {"intValue": str(v)}
        return {"doubleValue": v} if isinstance(v, float) else {"stringValue": v}

    spans = [
        {
            "traceId": s.trace_id,
            "spanId": s.span_id,
            "name": s.name,
            "startTimeUnixNano": str(round(s.start * 1e9)),
            "endTimeUnixNano": str(round(s.end * 1e9)),
            "attributes": [{"key": k, "value": value(v)} for k, v in s.attributes.items()],
            "status": {"code": 2 if s.error else 0},
        }
        for s in loss_and_takeover()
    ]
    return {"result": {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}}


def _summary(history: History) -> list[tuple[object, ...]]:
    return [
        (e.pod, e.outcome, e.reason, e.completion, e.previous_execution_id, len(e.steps))
        for e in history.executions
    ]


def test_saved_answers_of_either_api_give_the_crafted_history() -> None:
    """Classic and OTLP answers parse to the history the spans themselves give."""
    expected = _summary(history_from_spans(loss_and_takeover(), KEY))
    assert expected == [
        ("pod-a", "lost", "timeout", None, None, 8),
        ("pod-b", "completed", None, "accepted", "a1", 7),
    ]
    for document in (_v1_document(), _otlp_document()):
        assert _summary(history_from_spans(spans_from_document(document), KEY)) == expected


def test_timeline_from_a_saved_jaeger_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``curl .../api/traces?...`` saved to a file draws like the live search; --json keeps it."""
    document = _v1_document()
    saved = tmp_path / "answer.json"
    saved.write_text(json.dumps(document))
    kept = tmp_path / "history.json"
    assert main(["timeline", KEY, "--from", str(saved), "--json", str(kept)]) == 0
    out = capsys.readouterr().out
    assert "took the lease over from a1" in out
    assert History.from_json(kept.read_text()) == history_from_spans(
        spans_from_document(document), KEY
    )


def test_timeline_from_a_recorded_history_with_faults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A campaign's record file (monotonic clock, faults) renders; the page shows the fault."""
    recorded = tmp_path / "history.jsonl"
    a = Execution(
        job_key=KEY, execution_id="e1", pod="pod-a", start=10.0, end=12.5, fence=1,
        outcome="lost", reason="timeout",
        steps=(Step(at=12.0, name="lost", attrs={"reason": "timeout"}),),
    )  # fmt: skip
    b = Execution(
        job_key=KEY, execution_id="e2", pod="pod-b", start=13.0, end=14.0, fence=2,
        outcome="completed", completion="accepted", previous_execution_id="e1",
    )  # fmt: skip
    pause = FaultWindow(kind="pause", start=11.0, end=13.5, target="pod-a")
    recorded.write_text(
        header_line("monotonic") + "".join(record_line(item) for item in (a, pause, b))
    )
    page = tmp_path / "page.html"
    assert main(["timeline", KEY, "--from", str(recorded), "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"timeline of {KEY}: 2 executions on 2 pods, from monotonic 10.000s")
    assert "\nfaults " in out
    assert "fault pause on pod-a: +1.000s..+3.500s" in out
    drawn = page.read_text()
    assert 'class="fault"' in drawn
    assert 'class="takeover"' in drawn


def test_the_page_is_self_contained_and_escapes_what_it_shows() -> None:
    """No network reference (scripts, styles, images, fonts) and no unescaped text."""
    history = history_from_spans(loss_and_takeover(), KEY)
    evil = Execution(job_key=KEY, execution_id="<x>", pod="<script>alert(1)</script>", start=T0)
    drawn = render_html(
        History(clock="unix", executions=(*history.executions, evil)), title="a & b"
    )
    assert "<script>alert" not in drawn
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in drawn
    assert "<title>a &amp; b</title>" in drawn
    references = re.findall(r"""(?:src|href)\s*=|url\(|@import|https?://""", drawn)
    assert references == ["http://"]  # the SVG namespace, which is a name, not a request
    assert 'xmlns="http://www.w3.org/2000/svg"' in drawn


def test_bad_input_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unreachable Jaeger, a bad URL, a file that is no history, no key: exit 2."""
    garbage = tmp_path / "garbage.json"
    garbage.write_text("not json at all")
    for argv in (
        ["timeline", KEY, "--jaeger", "http://127.0.0.1:1"],
        ["timeline", KEY, "--jaeger", "ftp://jaeger"],
        ["timeline", KEY, "--from", str(garbage)],
        ["timeline", KEY, "--from", str(tmp_path / "missing.json")],
        ["timeline"],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("leaseworker timeline: error: "), argv
        assert err.count("\n") == 1, argv


def test_nothing_found_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A history without the key is not an error of the input: exit 1, and say so."""
    empty = tmp_path / "empty.json"
    empty.write_text(History().to_json())
    assert main(["timeline", KEY, "--from", str(empty)]) == 1
    assert f"no executions of {KEY} found in {empty}" in capsys.readouterr().err


def test_durations() -> None:
    """``--since`` takes seconds or a unit; anything else is refused."""
    assert [duration(t) for t in ("90", "90s", "10m", "2h", "1d", "1.5h")] == [
        90, 90, 600, 7200, 86400, 5400,
    ]  # fmt: skip
    for bad in ("", "0", "-5m", "10 minutes", "1w"):
        with pytest.raises(argparse.ArgumentTypeError):
            duration(bad)


def test_a_query_refuses_what_is_not_an_http_url() -> None:
    """The URL is checked before anything is sent."""
    with pytest.raises(JaegerError, match="not an http"):
        JaegerQuery("jaeger:16686", service="leaseworker")
