"""A real Jaeger, built from the pinned Go module, accepts OTLP and answers queries."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from leaseworker._timeline import JaegerQuery, JaegerSpan
from leaseworker_dev._services import LocalJaeger


@pytest.fixture(scope="session")
def jaeger_binary() -> Path:
    """Build Jaeger once per test session (minutes the first time, then cached)."""
    return LocalJaeger.ensure_built()


@pytest.fixture
def jaeger(jaeger_binary: Path, tmp_path: Path) -> Iterator[LocalJaeger]:
    """Start a private Jaeger for one test and stop it afterwards."""
    assert jaeger_binary.is_file()
    instance = LocalJaeger.start(workdir=tmp_path)
    try:
        yield instance
    finally:
        instance.stop()


def _post_otlp_json(endpoint: str, payload: dict[str, object]) -> int:
    request = urllib.request.Request(
        f"{endpoint}/v1/traces",
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(response.status)


def _wait_for_spans(jaeger: LocalJaeger, service: str, *, timeout: float) -> list[JaegerSpan]:
    deadline = time.monotonic() + timeout
    while True:
        spans = jaeger.find_traces(service)
        if spans or time.monotonic() > deadline:
            return spans
        time.sleep(0.1)


def _by_span_id(spans: list[JaegerSpan]) -> list[JaegerSpan]:
    return sorted(spans, key=lambda span: span.span_id)


def _listening_sockets(pid: int) -> set[tuple[str, int]]:
    """Return (address, port) of every TCP socket ``pid`` listens on, from /proc.

    Jaeger opens and closes descriptors while it runs (connections, files), so
    one listed by ``iterdir`` may be gone when its link is read: skip those.
    """
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:  # closed since it was listed
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A is TCP_LISTEN
                address, port = local.split(":")
                found.add((address, int(port, 16)))
    return found


def test_span_sent_over_otlp_http_is_found_with_typed_attributes(jaeger: LocalJaeger) -> None:
    """A span POSTed as OTLP/JSON comes back from the query API with its attributes.

    The int attribute must come back as an int (OTLP/JSON carries int64 as a
    string), so tests of the tracing integration can compare values directly.
    """
    service = f"leaseworker-test-{secrets.token_hex(4)}"
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    start_ns = time.time_ns()
    payload: dict[str, object] = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": service}}]
                },
                "scopeSpans": [
                    {
                        "scope": {"name": "tests.test_local_jaeger"},
                        "spans": [
                            {
                                "traceId": trace_id,
                                "spanId": span_id,
                                "name": "lease.renew",
                                "kind": 1,
                                "startTimeUnixNano": str(start_ns),
                                "endTimeUnixNano": str(start_ns + 2_000_000),
                                "attributes": [
                                    {"key": "lease.attempt", "value": {"intValue": "3"}},
                                    {"key": "lease.key", "value": {"stringValue": "job-42"}},
                                ],
                            }
                        ],
                    }
                ],
            }
        ]
    }

    assert _post_otlp_json(jaeger.otlp_http_endpoint, payload) == 200
    spans = _wait_for_spans(jaeger, service, timeout=15)

    assert len(spans) == 1, spans
    span = spans[0]
    assert span.service == service
    assert span.name == "lease.renew"
    assert span.trace_id == trace_id
    assert span.span_id == span_id
    assert span.parent_span_id is None
    assert span.start_time_unix_nano == start_ns
    assert span.end_time_unix_nano == start_ns + 2_000_000
    assert span.attributes == {"lease.attempt": 3, "lease.key": "job-42"}
    assert type(span.attributes["lease.attempt"]) is int
    assert jaeger.trace_url(trace_id) == f"{jaeger.query_url}/trace/{trace_id}"


def test_unknown_service_has_no_traces(jaeger: LocalJaeger) -> None:
    """Querying a service that sent nothing is an empty list, not an error."""
    assert jaeger.find_traces(f"nobody-{secrets.token_hex(4)}") == []


def test_every_listener_is_on_loopback_on_a_chosen_port(jaeger: LocalJaeger) -> None:
    """Jaeger binds only 127.0.0.1 and only the free ports it was given.

    Default ports (4317, 16686, 8888, ...) or wildcard addresses would clash
    between parallel runs and expose the service beyond this machine.
    """
    loopback_hex = "0100007F"  # 127.0.0.1 as /proc/net/tcp prints it
    expected = {
        (loopback_hex, jaeger.otlp_grpc_port),
        (loopback_hex, jaeger.otlp_http_port),
        (loopback_hex, jaeger.query_http_port),
        (loopback_hex, jaeger.query_grpc_port),
    }
    assert _listening_sockets(jaeger.process.pid) == expected


def test_both_query_apis_normalize_alike(jaeger: LocalJaeger) -> None:
    """The v3 API and the classic API give the same normalized spans.

    A parent/child pair with an error status and attribute types that the two
    APIs encode differently (int64, double, bool) checks the fallback's parsing
    against the same stored trace, since this Jaeger answers both.
    """
    service = f"leaseworker-test-{secrets.token_hex(4)}"
    trace_id, root_id, child_id = secrets.token_hex(16), secrets.token_hex(8), secrets.token_hex(8)
    start_ns = time.time_ns() // 1000 * 1000  # the classic API keeps microseconds
    spans = [
        {
            "traceId": trace_id,
            "spanId": root_id,
            "name": "job.run",
            "startTimeUnixNano": str(start_ns),
            "endTimeUnixNano": str(start_ns + 5_000_000),
        },
        {
            "traceId": trace_id,
            "spanId": child_id,
            "parentSpanId": root_id,
            "name": "lease.lost",
            "startTimeUnixNano": str(start_ns + 1_000_000),
            "endTimeUnixNano": str(start_ns + 2_000_000),
            "status": {"code": 2, "message": "fenced"},
            "attributes": [
                {"key": "lease.fence", "value": {"intValue": "9007199254740993"}},
                {"key": "lease.ratio", "value": {"doubleValue": 0.5}},
                {"key": "lease.renewed", "value": {"boolValue": False}},
            ],
        },
    ]
    payload: dict[str, object] = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": service}}]
                },
                "scopeSpans": [{"scope": {"name": "tests"}, "spans": spans}],
            }
        ]
    }
    assert _post_otlp_json(jaeger.otlp_http_endpoint, payload) == 200

    found = _wait_for_spans(jaeger, service, timeout=15)
    via_v3 = JaegerQuery(jaeger.query_url, service=service, api="v3").service_spans(since=600)
    via_v1 = JaegerQuery(jaeger.query_url, service=service, api="v1").service_spans(since=600)

    assert [s.name for s in found] == ["job.run", "lease.lost"]
    root, child = found
    assert root.parent_span_id is None
    assert root.status == "unset"
    assert child.parent_span_id == root_id
    assert child.status == "error"
    assert child.attributes == {
        "lease.fence": 9007199254740993,
        "lease.ratio": 0.5,
        "lease.renewed": False,
    }
    assert _by_span_id(via_v1) == _by_span_id(via_v3) == _by_span_id(found)


def test_stop_is_prompt_and_jaeger_dials_nothing(jaeger_binary: Path, tmp_path: Path) -> None:
    """SIGTERM stops Jaeger at once, without SIGKILL, and it never dials a default port.

    Jaeger v2's query service traces itself to localhost:4317 unless told not
    to; that would reach a developer's own collector and, with nothing there,
    keeps Jaeger retrying until the stop times out and escalates to SIGKILL.
    """
    assert jaeger_binary.is_file()
    jaeger = LocalJaeger.start(workdir=tmp_path)
    try:
        assert jaeger.find_traces("nobody") == []
    finally:
        started = time.monotonic()
        jaeger.stop()
        elapsed = time.monotonic() - started
    # 0 is a graceful shutdown; -SIGTERM means the signal won the race with the
    # collector, which installs its SIGTERM handler only after "Everything is
    # ready". Either way no SIGKILL was needed.
    assert jaeger.process.popen.returncode in (0, -signal.SIGTERM)
    assert elapsed < 5
    log = jaeger.process.log_path.read_text()
    # A port *ending* the address: a random port such as 43173 must not match.
    assert re.search(r":4317(?!\d)", log) is None, log


def test_a_temporary_work_directory_is_removed_by_stop(jaeger_binary: Path) -> None:
    """Started without a work directory, Jaeger leaves none behind."""
    assert jaeger_binary.is_file()
    jaeger = LocalJaeger.start()
    assert jaeger.workdir.is_dir()
    jaeger.stop()
    assert not jaeger.workdir.exists()
