"""``leaseworker timeline`` over HTTPS to Jaeger's query service, verified by a CA file.

One Jaeger serves both OTLP/HTTP and its query API on TLS with certificates
of the test CA. The test exports one ``process`` span of an execution over
HTTPS, then draws its timeline through ``https://`` with the CA given by
flag and by ``LEASEWORKER_JAEGER_CA_FILE``; the other CA, and no CA (the
system's), are refused with one line and exit 2.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.request
import uuid
from pathlib import Path

import anyio

from leaseworker._telemetry import names as n
from leaseworker_dev._services import LocalJaeger, TestCA

from ..waiting import eventually
from .cli import leaseworker

SERVICE = "timeline-tls"


def _export_execution(jaeger: LocalJaeger, ca: TestCA, key: str) -> None:
    """POST one execution's ``process`` span (OTLP/JSON) to the HTTPS receiver."""
    now = time.time_ns()
    attributes = {n.JOB_KEY: key, n.EXECUTION_ID: uuid.uuid4().hex, n.POD: "pod-a"}
    span = {
        "traceId": uuid.uuid4().hex,
        "spanId": uuid.uuid4().hex[:16],
        "name": "process jobs",
        "kind": 5,
        "startTimeUnixNano": str(now - 2_000_000_000),
        "endTimeUnixNano": str(now),
        "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attributes.items()],
    }
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": SERVICE}}]}
    body = {"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": [span]}]}]}
    request = urllib.request.Request(
        f"{jaeger.otlp_http_endpoint}/v1/traces",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    context = ssl.create_default_context(cafile=str(ca.ca_file))
    with urllib.request.urlopen(request, timeout=10, context=context) as answer:
        assert answer.status == 200


async def test_timeline_over_https_with_the_jaeger_ca_file_ssl(
    test_ca: TestCA, other_ca: TestCA, tmp_path: Path
) -> None:
    """The right CA draws the execution; the other CA or none exits 2 with one line."""
    leaf = test_ca.server(name="jaeger-query")
    jaeger = LocalJaeger.start(
        workdir=tmp_path / "jaeger",
        otlp_tls=(leaf.cert, leaf.key),
        query_tls=(leaf.cert, leaf.key, test_ca.ca_file),
    )
    try:
        assert jaeger.query_url.startswith("https://")
        key = f"report:tls-{uuid.uuid4().hex[:6]}:2026-11"
        _export_execution(jaeger, test_ca, key)

        async def stored() -> bool:
            spans = await anyio.to_thread.run_sync(jaeger.find_traces, SERVICE)
            return bool(spans)

        await eventually(stored, within=20)
        argv = ("timeline", key, "--jaeger", jaeger.query_url, "--service", SERVICE)
        for how in ("flag", "env"):
            flag = ("--jaeger-ca-file", str(test_ca.ca_file)) if how == "flag" else ()
            env = {"LEASEWORKER_JAEGER_CA_FILE": str(test_ca.ca_file)} if how == "env" else {}
            drawn = leaseworker(*argv, *flag, "--color", "never", env=env)
            assert drawn.code == 0, drawn.stderr
            assert f"timeline of {key}: 1 execution" in drawn.stdout, drawn.stdout
        for refused in (
            leaseworker(*argv, "--jaeger-ca-file", str(other_ca.ca_file)),
            leaseworker(*argv),  # the system CAs do not know the test CA
        ):
            line = refused.refusal()
            assert line.startswith("leaseworker timeline: error: cannot reach Jaeger at https://")
            assert "CERTIFICATE_VERIFY_FAILED" in line, line
            assert refused.stderr.count("\n") == 1, refused.stderr
    finally:
        jaeger.stop()
