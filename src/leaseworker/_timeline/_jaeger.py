"""Find every span of a job key in Jaeger, through its HTTP query API.

Jaeger's classic ``GET /api/traces`` searches by tag (span attributes
included), so ``tags={"leaseworker.job.key": KEY}`` returns exactly the traces
of that key. Its OTLP-shaped ``GET /api/v3/traces`` takes no attribute filter
over HTTP (Jaeger 2.x: "most curiously not supported by grpc-gateway"), so it
is used only where the classic route is missing, and the traces of the
service are filtered here. Both answers become :class:`~._spans.Span` s.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, final

from .._telemetry import _names as n
from ._spans import Span

Api = Literal["auto", "v1", "v3"]
"""Which query API to use: ``auto`` is the tag search, or v3 where that route is missing."""

DEFAULT_LIMIT = 500
"""How many traces one search returns at most (one trace per trigger)."""


class JaegerError(Exception):
    """Jaeger could not be asked, or answered something that is not a search result."""


@dataclass(frozen=True, slots=True)
class Found:
    """What a search found: the spans, which API answered, and whether ``limit`` cut it."""

    spans: list[Span]
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

    def __init__(self, url: str, *, service: str, timeout: float = 10.0, api: Api = "auto") -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise JaegerError(f"not an http(s) URL of a Jaeger query service: {url!r}")
        self._url = url.rstrip("/")
        self._service = service
        self._timeout = timeout
        self._api = api

    def job_key(self, job_key: str, *, since: float, limit: int = DEFAULT_LIMIT) -> Found:
        """Return the spans of every trace of ``job_key`` that started in the last ``since`` s."""
        end = datetime.now(UTC).timestamp() + 60  # spans stamped a little ahead still count
        start = end - 60 - since
        if self._api == "v3":
            return self._v3(job_key, start, end, limit)
        status, body = self._get(
            "/api/traces",
            {
                "service": self._service,
                "tags": json.dumps({n.JOB_KEY: job_key}),
                "start": str(int(start * 1_000_000)),
                "end": str(int(end * 1_000_000)),
                "limit": str(limit),
            },
        )
        if status == 200:
            traces = _json(body).get("data") or []
            return Found(_from_v1(traces), "/api/traces", len(traces), len(traces) >= limit)
        if status != 404 or self._api == "v1":
            raise JaegerError(f"Jaeger /api/traces answered HTTP {status}: {_excerpt(body)}")
        return self._v3(job_key, start, end, limit)

    def _v3(self, job_key: str, start: float, end: float, limit: int) -> Found:
        status, body = self._get(
            "/api/v3/traces",
            {
                "query.service_name": self._service,
                "query.start_time_min": _rfc3339(start),
                "query.start_time_max": _rfc3339(end),
                "query.num_traces": str(limit),
            },
        )
        if status == 404 and isinstance(_json(body, strict=False).get("error"), dict):
            return Found([], "/api/v3/traces", 0, truncated=False)  # v3's "no traces found"
        if status != 200:
            raise JaegerError(f"Jaeger /api/v3/traces answered HTTP {status}: {_excerpt(body)}")
        spans = _from_otlp(_json(body).get("result") or {})
        keyed = {s.trace_id for s in spans if s.attributes.get(n.JOB_KEY) == job_key}
        traces = {s.trace_id for s in spans}
        found = [s for s in spans if s.trace_id in keyed]
        return Found(found, "/api/v3/traces", len(keyed), len(traces) >= limit)

    def _get(self, path: str, query: dict[str, str]) -> tuple[int, bytes]:
        url = f"{self._url}{path}?{urllib.parse.urlencode(query)}"
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                return int(response.status), bytes(response.read())
        except urllib.error.HTTPError as exc:
            with exc:
                return int(exc.code), bytes(exc.read())
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise JaegerError(f"cannot reach Jaeger at {self._url}: {reason}") from exc


def spans_from_document(document: Any) -> list[Span]:
    """Read spans from a saved Jaeger answer: classic (``data``) or OTLP (``resourceSpans``)."""
    if isinstance(document, dict) and "data" in document:
        return _from_v1(document["data"] or [])
    if isinstance(document, dict):
        return _from_otlp(document.get("result", document))
    raise JaegerError("not a Jaeger search answer")


def _from_v1(traces: list[dict[str, Any]]) -> list[Span]:
    spans: list[Span] = []
    for trace in traces:
        processes: dict[str, Any] = trace.get("processes") or {}
        for raw in trace.get("spans") or []:
            tags = {t["key"]: _v1_value(t) for t in raw.get("tags") or []}
            parent, links = None, []
            for ref in raw.get("references") or []:
                pair = (_hex(ref["traceID"], 32), _hex(ref["spanID"], 16))
                if ref.get("refType") == "CHILD_OF" and parent is None:
                    parent = pair[1]
                else:
                    links.append(pair)
            start = int(raw.get("startTime", 0)) / 1e6
            process = processes.get(raw.get("processID", ""), {})
            error = str(tags.get("otel.status_code", "")).upper() == "ERROR" or tags.get("error")
            spans.append(
                Span(
                    trace_id=_hex(raw["traceID"], 32),
                    span_id=_hex(raw["spanID"], 16),
                    name=str(raw.get("operationName", "")),
                    start=start,
                    end=start + int(raw.get("duration", 0)) / 1e6,
                    attributes=tags,
                    parent_span_id=parent,
                    links=tuple(links),
                    error=bool(error),
                    service=str(process.get("serviceName", "")),
                )
            )
    return spans


def _from_otlp(traces_data: dict[str, Any]) -> list[Span]:
    spans: list[Span] = []
    for resource_spans in traces_data.get("resourceSpans") or []:
        resource = _otlp_attributes(resource_spans.get("resource", {}).get("attributes") or [])
        for scope_spans in resource_spans.get("scopeSpans") or []:
            for raw in scope_spans.get("spans") or []:
                status = raw.get("status", {}).get("code", 0)
                spans.append(
                    Span(
                        trace_id=_hex(raw["traceId"], 32),
                        span_id=_hex(raw["spanId"], 16),
                        name=str(raw.get("name", "")),
                        start=int(raw.get("startTimeUnixNano", 0)) / 1e9,
                        end=int(raw.get("endTimeUnixNano", 0)) / 1e9,
                        attributes=_otlp_attributes(raw.get("attributes") or []),
                        parent_span_id=_hex(raw["parentSpanId"], 16)
                        if raw.get("parentSpanId")
                        else None,
                        links=tuple(
                            (_hex(link["traceId"], 32), _hex(link["spanId"], 16))
                            for link in raw.get("links") or []
                        ),
                        error=status in (2, "STATUS_CODE_ERROR"),
                        service=str(resource.get("service.name", "")),
                    )
                )
    return spans


def _otlp_attributes(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    return {p["key"]: _otlp_value(p.get("value") or {}) for p in pairs}


def _otlp_value(value: dict[str, Any]) -> Any:
    for kind, convert in (
        ("stringValue", str),
        ("boolValue", bool),
        ("intValue", int),  # int64 travels as a JSON string
        ("doubleValue", float),
    ):
        if kind in value:
            return convert(value[kind])
    return json.dumps(value, sort_keys=True)  # arrays, maps, bytes: shown, not interpreted


def _v1_value(tag: dict[str, Any]) -> Any:
    kind, value = tag.get("type"), tag.get("value")
    if kind == "int64":
        return int(value)  # type: ignore[arg-type]
    if kind == "float64":
        return float(value)  # type: ignore[arg-type]
    if kind == "bool":
        return bool(value)
    return value if isinstance(value, str) else json.dumps(value)


def _hex(value: str, digits: int) -> str:
    return str(value).lower().rjust(digits, "0")


def _json(body: bytes, *, strict: bool = True) -> dict[str, Any]:
    try:
        parsed = json.loads(body)
    except ValueError as exc:
        if not strict:
            return {}
        raise JaegerError(f"Jaeger answered something that is not JSON: {_excerpt(body)}") from exc
    if not isinstance(parsed, dict):
        if not strict:
            return {}
        raise JaegerError(f"Jaeger answered unexpected JSON: {_excerpt(body)}")
    return parsed


def _rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _excerpt(body: bytes) -> str:
    return body[:200].decode(errors="replace").replace("\n", " ")
