"""Find every span of a job key in Jaeger, through its HTTP query API.

Jaeger's classic ``GET /api/traces`` searches by tag (span attributes
included), so ``tags={"leaseworker.job.key": KEY}`` returns exactly the traces
of that key. Its OTLP-shaped ``GET /api/v3/traces`` takes no attribute filter
over HTTP (Jaeger 2.x: "most curiously not supported by grpc-gateway"), so it
is used only where the classic route is missing, and the traces of the
service are filtered here. Both answers become :class:`~._spans.Span` s for
the timeline (:meth:`JaegerQuery.job_key`), or stay :class:`JaegerSpan` s for
the dev services' and tests' look at everything a service sent
(:meth:`JaegerQuery.service_spans`). This is leaseworker's one Jaeger reader;
every failure is a :class:`JaegerError`.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, final

from .._history import Scalar
from .._telemetry import names as n
from ._jaeger_json import (
    JaegerSpan,
    spans_from_otlp,
    spans_from_v1,
    v3_found_nothing,
    without_v1_tags,
)
from ._spans import Span

Api = Literal["auto", "v1", "v3"]
"""Which query API to use: ``auto`` is the tag search, or v3 where that route is missing."""

DEFAULT_LIMIT = 500
"""How many traces one search returns at most (one trace per trigger)."""


V1 = "/api/traces"
V3 = "/api/v3/traces"


class JaegerError(Exception):
    """Jaeger could not be asked, or answered something that is not a search result."""


@dataclass(frozen=True, slots=True)
class Found:
    """What a search found: the spans, which API answered, and whether ``limit`` cut it."""

    spans: list[Span]
    api: str
    traces: int
    truncated: bool


@dataclass(frozen=True, slots=True)
class _Answer:
    """One search's spans as Jaeger gave them, and which API answered."""

    spans: list[JaegerSpan]
    api: str
    traces: int
    truncated: bool


@final
class JaegerQuery:
    """Searches one Jaeger query service (``url``, e.g. ``http://jaeger:16686``) for a service.

    ``api`` picks the query API (see :data:`Api`); the answer says which one answered.

    ::

        found = JaegerQuery("http://127.0.0.1:16686", service="leaseworker").job_key(
            "report:acme:2026-11", since=3600
        )
    """

    def __init__(
        self,
        url: str,
        *,
        service: str,
        timeout: float = 10.0,
        api: Api = "auto",
        ca_file: str | Path | None = None,
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise JaegerError(f"not an http(s) URL of a Jaeger query service: {url!r}")
        self._url = url.rstrip("/")
        self._service = service
        self._timeout = timeout
        self._api = api
        self._context = https_context(ca_file)

    def job_key(self, job_key: str, *, since: float, limit: int = DEFAULT_LIMIT) -> Found:
        """Return the spans of every trace of ``job_key`` that started in the last ``since`` s."""
        answer = self._search(since, limit, tags={n.JOB_KEY: job_key})
        if answer.api == V1:
            spans = [_span(raw, error=_v1_error(raw)) for raw in answer.spans]
            return Found(spans, V1, answer.traces, answer.truncated)
        keyed = {s.trace_id for s in answer.spans if s.attributes.get(n.JOB_KEY) == job_key}
        spans = [_span(raw, error=raw.status == "error") for raw in answer.spans]
        found = [s for s in spans if s.trace_id in keyed]
        return Found(found, V3, len(keyed), answer.truncated)

    def service_spans(self, *, since: float, limit: int = 100) -> list[JaegerSpan]:
        """Return every span of the service's traces of the last ``since`` s, by start time.

        A trace found contributes all its spans, those of other services too;
        nothing found is an empty list. v3 answers first here (where it is
        missing, the classic API, whose spans lose the tags its OTLP
        translation added, so both give the same spans).
        """
        answer = self._search(since, limit, tags=None)
        spans = [without_v1_tags(s) for s in answer.spans] if answer.api == V1 else answer.spans
        return sorted(spans, key=lambda s: (s.start_time_unix_nano, s.span_id))

    def _search(self, since: float, limit: int, *, tags: dict[str, str] | None) -> _Answer:
        """Ask one API, falling back to the other where its route is missing (HTTP 404).

        A tag search asks the classic API first (v3 cannot filter by attribute);
        a whole-service search asks v3 first (nanosecond times, no added tags).
        """
        end = datetime.now(UTC).timestamp() + 60  # spans stamped a little ahead still count
        start = end - 60 - since
        order = {"v1": (V1,), "v3": (V3,), "auto": (V1, V3) if tags else (V3, V1)}[self._api]
        missing = []
        for api in order:
            if api == V1:
                answer, problem = self._v1(start, end, limit, tags)
            else:
                answer, problem = self._v3(start, end, limit)
            if answer is not None:
                return answer
            missing.append(problem)
        raise JaegerError("; ".join(missing))

    def _v1(
        self, start: float, end: float, limit: int, tags: dict[str, str] | None
    ) -> tuple[_Answer | None, str]:
        query = {
            "service": self._service,
            "start": str(int(start * 1_000_000)),
            "end": str(int(end * 1_000_000)),
            "limit": str(limit),
        }
        if tags:
            query["tags"] = json.dumps(tags)
        status, body = self._get(V1, query)
        if status == 200:
            traces = _json(body).get("data") or []
            return _Answer(spans_from_v1(traces), V1, len(traces), len(traces) >= limit), ""
        problem = f"Jaeger {V1} answered HTTP {status}: {_excerpt(body)}"
        if status != 404:
            raise JaegerError(problem)
        return None, problem

    def _v3(self, start: float, end: float, limit: int) -> tuple[_Answer | None, str]:
        status, body = self._get(
            V3,
            {
                "query.service_name": self._service,
                "query.start_time_min": _rfc3339(start),
                "query.start_time_max": _rfc3339(end),
                "query.num_traces": str(limit),
            },
        )
        if status == 404 and v3_found_nothing(body):
            return _Answer([], V3, 0, truncated=False), ""
        problem = f"Jaeger {V3} answered HTTP {status}: {_excerpt(body)}"
        if status == 404:
            return None, problem
        if status != 200:
            raise JaegerError(problem)
        spans = spans_from_otlp(_json(body).get("result") or {})
        traces = len({s.trace_id for s in spans})
        return _Answer(spans, V3, traces, traces >= limit), ""

    def _get(self, path: str, query: dict[str, str]) -> tuple[int, bytes]:
        url = f"{self._url}{path}?{urllib.parse.urlencode(query)}"
        try:
            return http_get(url, timeout=self._timeout, context=self._context)
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise JaegerError(f"cannot reach Jaeger at {self._url}: {reason}") from exc


def https_context(ca_file: str | Path | None) -> ssl.SSLContext | None:
    """Return a context verifying HTTPS peers against ``ca_file`` (``None``: the system CAs).

    A missing or unreadable CA file is a ``JaegerError`` naming it, not a traceback.
    """
    if ca_file is None:
        return None
    try:
        return ssl.create_default_context(cafile=str(ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise JaegerError(f"cannot read the Jaeger CA file {ca_file}: {exc}") from exc


def http_get(
    url: str, *, timeout: float = 10.0, context: ssl.SSLContext | None = None
) -> tuple[int, bytes]:
    """GET ``url`` asking for JSON; return the status and body, also of a 4xx/5xx answer.

    Jaeger's answers to a search are read from errors too (v3's "no traces" is a 404).
    ``context`` verifies an ``https://`` peer (default: the system CAs).
    """
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return int(exc.code), bytes(exc.read())


def spans_from_document(document: Any) -> list[Span]:
    """Read spans from a saved Jaeger answer: classic (``data``) or OTLP (``resourceSpans``)."""
    if isinstance(document, dict) and "data" in document:
        return _from_v1(document["data"] or [])
    if isinstance(document, dict):
        return _from_otlp(document.get("result", document))
    raise JaegerError("not a Jaeger search answer")


def _from_v1(traces: list[dict[str, Any]]) -> list[Span]:
    return [_span(raw, error=_v1_error(raw)) for raw in spans_from_v1(traces)]


def _v1_error(raw: JaegerSpan) -> bool:
    """Tell whether a classic answer's span is an error: by its status or its ``error`` tag."""
    return raw.status == "error" or bool(raw.attributes.get("error"))


def _from_otlp(traces_data: dict[str, Any]) -> list[Span]:
    return [_span(raw, error=raw.status == "error") for raw in spans_from_otlp(traces_data)]


def _span(raw: JaegerSpan, *, error: bool) -> Span:
    """Return the timeline's span: times in seconds, non-scalar attributes shown as JSON."""
    return Span(
        trace_id=raw.trace_id,
        span_id=raw.span_id,
        name=raw.name,
        start=raw.start_time_unix_nano / 1e9,
        end=raw.end_time_unix_nano / 1e9,
        attributes={key: _scalar(value) for key, value in raw.attributes.items()},
        parent_span_id=raw.parent_span_id,
        links=raw.links,
        error=error,
        service=raw.service,
    )


def _scalar(value: Any) -> Scalar:
    """Keep a text, number or boolean; show anything else (arrays, maps) as its JSON text."""
    if isinstance(value, str | int | float | bool):
        return value
    return json.dumps(value, sort_keys=True)


def _json(body: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(body)
    except ValueError as exc:
        raise JaegerError(f"Jaeger answered something that is not JSON: {_excerpt(body)}") from exc
    if not isinstance(parsed, dict):
        raise JaegerError(f"Jaeger answered unexpected JSON: {_excerpt(body)}")
    return parsed


def _rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _excerpt(body: bytes) -> str:
    return body[:200].decode(errors="replace").replace("\n", " ")
