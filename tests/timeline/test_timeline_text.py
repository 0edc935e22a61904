"""The text timeline of crafted span sets, against golden files (``tests/timeline/golden``).

Each scenario's spans go through the same conversion as Jaeger's answer
(:func:`history_from_spans`) and :func:`render_text`. To accept a deliberate
change of the drawing, run with ``LW_UPDATE_GOLDEN=1`` and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from leaseworker._timeline import history_from_spans, render_text

from .spansets import KEY, SCENARIOS, Trigger

GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_text_timeline_matches_its_golden_file(scenario: str) -> None:
    """The drawing is exactly the reviewed one, fits 100 columns and uses no colour codes."""
    history = history_from_spans(SCENARIOS[scenario](), KEY)
    drawn = render_text(history)
    golden = GOLDEN / f"{scenario}.txt"
    if os.environ.get("LW_UPDATE_GOLDEN"):
        golden.write_text(drawn, encoding="utf-8")
    assert drawn == golden.read_text(encoding="utf-8")
    assert max(len(line) for line in drawn.splitlines()) <= 100
    assert "\x1b[" not in drawn


def test_colour_only_adds_escape_codes() -> None:
    """With ``color=True`` the same characters come out, wrapped in ANSI codes."""
    history = history_from_spans(SCENARIOS["paused_overlap_stale"](), KEY)
    coloured = render_text(history, color=True)
    assert "\x1b[1;35m^\x1b[0m" in coloured  # the overlap, in magenta
    stripped = coloured
    for code in (
        "\x1b[0m",
        "\x1b[1;35m",
        "\x1b[1;31m",
        "\x1b[31m",
        "\x1b[32m",
        "\x1b[33m",
        "\x1b[36m",
    ):
        stripped = stripped.replace(code, "")
    assert stripped == render_text(history)


def test_an_execution_shows_what_its_children_spent() -> None:
    """The ``job run`` span's child CPU (``run_in_process``) is in the execution's line."""
    a = Trigger("pod-a", offset=3)
    a.process(0.0, 2.0, "c1", "lost").held("c1", 7, 0.05)
    a.span("job run", 0.05, 1.5, execution="c1", fence=7, outcome="lost", process__cpu_seconds=1.25)
    history = history_from_spans(a.spans, job_key=KEY)
    [execution] = history.executions
    assert execution.cpu_seconds == 1.25
    assert "child CPU 1.250s" in render_text(history)
