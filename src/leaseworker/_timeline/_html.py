"""The timeline as a self-contained HTML page (placeholder: the text in a ``<pre>``)."""

from __future__ import annotations

import html

from .._history import History
from ._text import render_text


def render_html(history: History, *, title: str = "leaseworker timeline") -> str:
    """Draw ``history`` as a page with no network references."""
    body = html.escape(render_text(history))
    return f"<!doctype html><title>{html.escape(title)}</title><pre>{body}</pre>\n"
