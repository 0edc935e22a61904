"""The timeline of job keys: one lane per pod, each execution a bar, overlaps marked.

``_layout`` places a :class:`~leaseworker._history.History` on one time axis
(lanes, overlaps, step labels); ``_text`` draws it for a terminal
(``render_text``), ``_html`` as a self-contained page (``render_html``). Every
history, from Jaeger traces or from a fault campaign's recorders, is drawn by
this one component. ``_spans`` turns leaseworker's spans into a history,
``_jaeger_query`` is leaseworker's one Jaeger reader (a job key's spans for the
timeline, a service's for ``LocalJaeger`` and the tests; one error type),
reading its answers with ``_jaeger_json``.
"""

from ._html import render_html as render_html
from ._jaeger_json import JaegerSpan as JaegerSpan
from ._jaeger_query import JaegerError as JaegerError
from ._jaeger_query import JaegerQuery as JaegerQuery
from ._jaeger_query import http_get as http_get
from ._jaeger_query import https_context as https_context
from ._jaeger_query import spans_from_document as spans_from_document
from ._spans import Span as Span
from ._spans import history_from_spans as history_from_spans
from ._text import render_text as render_text

__all__ = [
    "JaegerError",
    "JaegerQuery",
    "JaegerSpan",
    "Span",
    "history_from_spans",
    "http_get",
    "https_context",
    "render_html",
    "render_text",
    "spans_from_document",
]
