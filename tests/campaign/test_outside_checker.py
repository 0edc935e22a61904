"""Porcupine, a checker we did not write, judges the store operations of a history.

A clean hand-over passes; a stale fence accepted, two accepted completions of
one version and a stale answer nothing explains each fail it, and our own
checker fails the first two too. A checker that cannot fail is a defect.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leaseworker._history import Step
from leaseworker.toolkit import Execution, History
from leaseworker_dev._campaign import (
    Records,
    Stored,
    check,
    outside_available,
    outside_operations,
    outside_verdict,
)

KEY = "report:acme:2026-11"

pytestmark = pytest.mark.skipif(
    not outside_available(), reason="no Go toolchain to build the porcupine checker"
)


def _run(
    eid: str, start: float, fence: int, version: str, *answers: tuple[float, str]
) -> Execution:
    """An execution from ``start`` (acquired) whose completion tries answered ``answers``."""
    steps = tuple(
        Step(at=at, name="completion", duration=0.05, attrs={"status": status, "fence": fence})
        for at, status in answers
    )
    last = answers[-1][1] if answers else None
    return Execution(
        job_key=KEY,
        execution_id=eid,
        pod=f"pod-{eid}",
        start=start,
        end=start + 3.0,
        fence=fence,
        input_version=version,
        outcome="completed" if last == "accepted" else "lost",
        completion=last,
        steps=steps,
    )


def _history(*executions: Execution) -> History:
    return History(clock="monotonic", executions=executions)


def _failed(name: str, history: History, records: Records) -> bool:
    return not next(v for v in check(history, records) if v.name == name).passed


ONE_COMPLETION = "one completion per identity, highest fence, none stale"


def test_a_clean_hand_over_is_linearizable() -> None:
    """Fence 10 is taken over by 11's claim: its try stale; 11 accepted, a redelivery duplicate."""
    history = _history(
        _run("a", 0.0, 10, "v1", (2.5, "stale")),
        _run("b", 2.0, 11, "v1", (3.0, "accepted")),
        _run("c", 6.0, 12, "v1", (6.5, "duplicate")),
        _run("d", 8.0, 13, "v2", (8.5, "accepted")),
    )
    records = Records(
        completions={
            (KEY, "v1"): Stored(fence=11, execution_id="b"),
            (KEY, "v2"): Stored(fence=13, execution_id="d"),
        }
    )
    verdict = outside_verdict(history, records)
    assert verdict.passed, verdict.line()
    assert verdict.counts == {"keys": 1, "operations": 8}  # four claims, four completions
    assert verdict.line().startswith("PASS outside checker (porcupine) (linearizable)")


def test_what_the_history_does_not_show_is_open_but_not_free() -> None:
    """A killed pod's completion the store holds is accepted at an unknown time after its start.

    A retry answered duplicate to its own earlier try counts as that try's acceptance.
    """
    history = _history(
        _run("a", 0.0, 10, "v1"),  # killed: no answer recorded, the store holds it
        _run("b", 5.0, 11, "v1", (5.5, "duplicate")),
        _run("c", 7.0, 12, "v2", (7.5, "duplicate")),  # its first try was taken
    )
    records = Records(
        completions={
            (KEY, "v1"): Stored(fence=10, execution_id="a"),
            (KEY, "v2"): Stored(fence=12, execution_id="c"),
        }
    )
    ops = outside_operations(history, records)
    assert [(op["op"], op["status"]) for op in ops if op["version"] == "v2"] == [
        ("claim", None),
        ("complete", "accepted"),
    ]
    killed = [op for op in ops if op["op"] == "complete" and op["version"] == "v1"]
    assert killed[-1]["return"] is None  # open: the answer was never seen
    assert killed[-1]["call"] == 0  # from its execution's start
    assert outside_verdict(history, records).passed
    # The same store holding a v1 completion accepted only after b's duplicate: refused.
    late = _history(
        _run("a", 6.0, 10, "v1"),
        _run("b", 5.0, 11, "v1", (5.5, "duplicate")),
    )
    assert not outside_verdict(late, records).passed


def test_a_stale_fence_accepted_fails_both_checkers(tmp_path: Path) -> None:
    """Fence 11 accepted after fence 12 had been accepted for the key; its input is kept."""
    history = _history(
        _run("a", 0.0, 12, "v1", (1.0, "accepted")),
        _run("b", 0.5, 11, "v2", (3.0, "accepted")),
    )
    records = Records(
        completions={
            (KEY, "v1"): Stored(fence=12, execution_id="a"),
            (KEY, "v2"): Stored(fence=11, execution_id="b"),
        }
    )
    kept = tmp_path / "store-ops.jsonl"
    verdict = outside_verdict(history, records, keep=kept)
    assert not verdict.passed
    lines = [json.loads(line) for line in kept.read_text().splitlines()]
    assert lines[0] == {"format": "leaseworker.ops/1"}
    assert len(lines) == 1 + 4  # two claims, two completions: what Porcupine read
    assert verdict.violations == (f"NOT linearizable (keys {KEY})",)
    assert _failed(ONE_COMPLETION, history, records)
    refused = _history(history.executions[0], _run("b", 0.5, 11, "v2", (3.0, "stale")))
    assert outside_verdict(
        refused, Records(completions={(KEY, "v1"): records.completions[(KEY, "v1")]})
    ).passed


def test_two_accepted_completions_of_one_version_fail_both_checkers() -> None:
    """Fences 10 and 11 both accepted for v1, one after the other."""
    history = _history(
        _run("a", 0.0, 10, "v1", (1.0, "accepted")),
        _run("b", 2.0, 11, "v1", (3.0, "accepted")),
    )
    records = Records(completions={(KEY, "v1"): Stored(fence=11, execution_id="a")})
    assert not outside_verdict(history, records).passed
    assert _failed(ONE_COMPLETION, history, records)
    answered = _history(history.executions[0], _run("b", 2.0, 11, "v1", (3.0, "duplicate")))
    assert outside_verdict(answered, records).passed


def test_a_stale_answer_with_no_higher_fence_fails() -> None:
    """Refused as stale although no higher fence ever reached the store."""
    history = _history(
        _run("a", 0.0, 10, "v1", (1.0, "stale")),
        _run("b", 2.0, 11, "v1", (3.0, "accepted")),  # claims only after a's answer
    )
    records = Records(completions={(KEY, "v1"): Stored(fence=11, execution_id="b")})
    assert not outside_verdict(history, records).passed


def test_an_open_claim_ends_once_a_fence_as_high_is_in() -> None:
    """A lost execution's claim is open until a higher fence's claim returned; later, it is moot.

    Porcupine would try every open claim in every order before refusing a bad history.
    """
    history = _history(
        _run("a", 0.0, 10, "v1"),  # lost: its claim's answer never seen
        _run("b", 1.0, 11, "v1", (2.0, "accepted")),
        _run("c", 3.0, 9, "v2"),  # a lower fence sent after 11 was in: changes nothing
    )
    records = Records(completions={(KEY, "v1"): Stored(fence=11, execution_id="b")})
    ops = outside_operations(history, records)
    claims = {op["client"]: op for op in ops if op["op"] == "claim"}
    assert claims[0]["return"] == claims[1]["return"] == 2_000_000_000
    assert sorted(claims) == [0, 1]
    assert outside_verdict(history, records).passed
