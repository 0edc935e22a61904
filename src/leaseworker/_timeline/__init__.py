"""The timeline of job keys: one lane per pod, each execution a bar, overlaps marked.

``render_text`` draws a :class:`~leaseworker._history.History` for a terminal,
``render_html`` as a self-contained page. Every history (from Jaeger traces or
from a fault campaign's recorders) is drawn by this one component.
"""

from ._html import render_html as render_html
from ._text import render_text as render_text

__all__ = ["render_html", "render_text"]
