"""The timeline as text for a terminal (placeholder: one line per execution)."""

from __future__ import annotations

from .._history import History


def render_text(history: History, *, width: int = 100, color: bool = False) -> str:
    """Draw ``history`` in at most ``width`` columns; ANSI colour only when ``color``."""
    del width, color
    lines = [
        f"{e.job_key} {e.pod} fence={e.fence} {e.start:.3f}..{e.end} {e.outcome}"
        for e in sorted(history.executions, key=lambda e: e.start)
    ]
    return "\n".join(lines) + "\n"
