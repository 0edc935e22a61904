"""The one Jaeger reader's choice of query API, against a stand-in with only some routes.

A job-key search asks the classic API (the only one that filters by tag) and
v3 where that route is missing; a whole-service search asks v3 first and the
classic API where v3 is missing; every failure is a ``JaegerError``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from leaseworker._timeline import JaegerError, JaegerQuery

pytestmark = pytest.mark.fake

TRACE, SPAN = "ab" * 16, "cd" * 8
V3_ANSWER = {
    "result": {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "s"}}]
                },
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": TRACE,
                                "spanId": SPAN,
                                "name": "job run",
                                "startTimeUnixNano": "1000000001",
                                "endTimeUnixNano": "2000000001",
                                "attributes": [
                                    {"key": "leaseworker.job.key", "value": {"stringValue": "k"}}
                                ],
                            }
                        ]
                    }
                ],
            }
        ]
    }
}
V1_ANSWER = {
    "data": [
        {
            "processes": {"p1": {"serviceName": "s"}},
            "spans": [
                {
                    "traceID": TRACE,
                    "spanID": SPAN,
                    "operationName": "job run",
                    "processID": "p1",
                    "startTime": 1000000,
                    "duration": 1000000,
                    "tags": [
                        {"key": "leaseworker.job.key", "type": "string", "value": "k"},
                        {"key": "span.kind", "type": "string", "value": "internal"},
                    ],
                }
            ],
        }
    ]
}


@dataclass
class StandIn:
    """The routes a stand-in Jaeger answers, the paths it was asked, and its URL."""

    url: str = ""
    routes: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)

    def query(self, **kwargs: Any) -> JaegerQuery:
        """Return the reader pointed at this stand-in, for service ``s``."""
        return JaegerQuery(self.url, service="s", **kwargs)


@pytest.fixture
def jaeger() -> Iterator[StandIn]:
    """A loopback HTTP server answering only the routes a test gives it."""
    stand_in = StandIn()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            stand_in.asked.append(path)
            status, body = stand_in.routes.get(path, (404, b"404 page not found"))
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    stand_in.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield stand_in
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_job_key_search_uses_the_tag_search_and_v3_only_where_it_is_missing(
    jaeger: StandIn,
) -> None:
    """Both routes there: the classic one answers; without it, v3 answers the same span."""
    jaeger.routes = {
        "/api/traces": (200, json.dumps(V1_ANSWER).encode()),
        "/api/v3/traces": (200, json.dumps(V3_ANSWER).encode()),
    }
    found = jaeger.query().job_key("k", since=60)
    assert (found.api, [s.name for s in found.spans], jaeger.asked) == (
        "/api/traces",
        ["job run"],
        ["/api/traces"],
    )
    del jaeger.routes["/api/traces"]
    jaeger.asked.clear()
    found = jaeger.query().job_key("k", since=60)
    assert (found.api, [s.name for s in found.spans], jaeger.asked) == (
        "/api/v3/traces",
        ["job run"],
        ["/api/traces", "/api/v3/traces"],
    )


def test_a_service_search_asks_v3_first_and_the_classic_api_where_v3_is_missing(
    jaeger: StandIn,
) -> None:
    """Either route gives the same span: v3's nanoseconds, the classic one without added tags."""
    jaeger.routes = {"/api/v3/traces": (200, json.dumps(V3_ANSWER).encode())}
    [via_v3] = jaeger.query().service_spans(since=60)
    jaeger.routes = {"/api/traces": (200, json.dumps(V1_ANSWER).encode())}
    [via_v1] = jaeger.query().service_spans(since=60)
    assert via_v3.start_time_unix_nano == 1_000_000_001
    assert via_v1.attributes == via_v3.attributes == {"leaseworker.job.key": "k"}
    assert (via_v1.trace_id, via_v1.span_id, via_v1.name) == (TRACE, SPAN, "job run")


def test_every_failure_is_a_jaeger_error(jaeger: StandIn) -> None:
    """No route, a server error, or no server at all: one error type, one line."""
    with pytest.raises(JaegerError, match=r"/api/v3/traces answered HTTP 404"):
        jaeger.query().service_spans(since=60)
    with pytest.raises(JaegerError, match=r"/api/traces answered HTTP 404"):
        jaeger.query(api="v1").job_key("k", since=60)
    jaeger.routes = {"/api/traces": (500, b"boom")}
    with pytest.raises(JaegerError, match=r"/api/traces answered HTTP 500: boom"):
        jaeger.query().job_key("k", since=60)
    with pytest.raises(JaegerError, match="cannot reach Jaeger"):
        JaegerQuery("http://127.0.0.1:9", service="s", timeout=2).service_spans(since=60)
