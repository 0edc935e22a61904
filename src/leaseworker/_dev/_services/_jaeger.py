"""A private Jaeger v2 on free loopback ports, with in-memory trace storage.

Built from source with the Go toolchain, pinned by the Go module in
``deploy/local/jaeger`` (shipped in the wheel too) and cached outside the
clone; its JSON query API is complete, its web UI is a placeholder. See docs/design.md#local-jaeger.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Self, TypedDict

from ..._timeline._jaeger import http_get
from ..._timeline._jaeger_json import (
    V1_SYNTHETIC_TAGS,
    JaegerSpan,
    SpanStatus,
    spans_from_otlp,
    spans_from_v1,
    v3_found_nothing,
)
from ._proc import LOOPBACK, LocalProcess, cache_dir, distinct_free_ports, wait_for_port
from ._shipped import ToolMissingError, shipped

JAEGER_VERSION = "v1.76.0"
"""The Jaeger release pinned in ``deploy/local/jaeger/go.mod``."""

JAEGER_PACKAGE = "github.com/jaegertracing/jaeger/cmd/jaeger"
"""The Go package of the Jaeger v2 binary (an OpenTelemetry Collector distribution)."""

MAX_TRACES = 100_000
"""How many traces the in-memory store keeps before it drops the oldest."""

_log = logging.getLogger(__name__)


class FoundSpan(TypedDict):
    """One span as :meth:`LocalJaeger.find_traces` returns it.

    The form is the same whichever query API answered, so tests can compare
    plain values: ids are lowercase hex (32 digits for traces, 16 for spans),
    ``parent_span_id`` is ``None`` for a root span, times are Unix nanoseconds,
    and ``attributes`` is flat: ``{"key": value}`` with OTLP integers as ``int``,
    doubles as ``float``, booleans as ``bool``, arrays as ``list``, key-value
    lists as ``dict`` and bytes as their base64 text.
    """

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str | None
    start_time_unix_nano: int
    end_time_unix_nano: int
    status: SpanStatus
    attributes: dict[str, Any]


def deploy_dir() -> Path:
    """Return the ``deploy/local/jaeger`` Go module directory (a clone's or the wheel's)."""
    return shipped("deploy/local/jaeger/go.mod").parent


@dataclass
class LocalJaeger:
    """A running Jaeger v2 (``cmd/jaeger``) with memory storage, bound to loopback.

    Every listener (OTLP gRPC, OTLP HTTP, query HTTP and query gRPC) is on its
    own free port on ``127.0.0.1``; the collector's self-metrics are turned off so
    nothing binds a fixed default port such as 4317, 16686 or 8888.
    """

    otlp_grpc_port: int
    otlp_http_port: int
    query_http_port: int
    query_grpc_port: int
    workdir: Path
    process: LocalProcess
    remove_workdir: bool = field(default=False, repr=False)  # a temp dir of its own
    otlp_https: bool = False  # the OTLP/HTTP receiver serves TLS (``start(otlp_tls=...)``)

    @property
    def otlp_grpc_endpoint(self) -> str:
        """The OTLP/gRPC endpoint, as OpenTelemetry's gRPC span exporter expects it."""
        return f"http://{LOOPBACK}:{self.otlp_grpc_port}"

    @property
    def otlp_http_endpoint(self) -> str:
        """The OTLP/HTTP base URL; traces are POSTed to ``{endpoint}/v1/traces``."""
        scheme = "https" if self.otlp_https else "http"
        return f"{scheme}://{LOOPBACK}:{self.otlp_http_port}"

    @property
    def query_url(self) -> str:
        """The base URL of the query service (JSON APIs and UI routes)."""
        return f"http://{LOOPBACK}:{self.query_http_port}"

    def trace_url(self, trace_id: str) -> str:
        """Return the UI URL of one trace (a placeholder page in this build).

        The same trace as JSON is at ``{query_url}/api/v3/traces/{trace_id}``.
        """
        return f"{self.query_url}/trace/{trace_id.lower()}"

    @staticmethod
    def binary_path() -> Path:
        """Return where the built binary lives (it may not exist yet)."""
        return cache_dir(f"jaeger-{JAEGER_VERSION}") / "jaeger"

    @classmethod
    def ensure_built(cls) -> Path:
        """Build the pinned Jaeger unless the cached binary exists; return its path.

        The first build compiles a few thousand Go packages and takes minutes;
        later calls return at once. The build writes to a temporary name and
        renames it into place, so an interrupted build never leaves a binary that
        looks complete. Its output goes to ``build.log`` beside the binary.
        """
        binary = cls.binary_path()
        if binary.is_file():
            return binary
        module = deploy_dir()
        # The official Go tarball installs to /usr/local/go, often not on a CI PATH.
        go = shutil.which("go") or shutil.which("go", path="/usr/local/go/bin")
        if go is None:
            raise ToolMissingError(
                "the Go toolchain is not on PATH; LocalJaeger builds Jaeger "
                f"{JAEGER_VERSION} from source with it (see deploy/local/jaeger/go.mod)"
            )
        partial = binary.with_name(f"jaeger.partial-{os.getpid()}")
        build_log = binary.with_name("build.log")
        _log.warning("building Jaeger %s into %s (minutes the first time)", JAEGER_VERSION, binary)
        started = time.monotonic()
        with build_log.open("wb") as log:
            result = subprocess.run(
                [go, "build", "-o", str(partial), JAEGER_PACKAGE],
                cwd=module,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=False,
            )
        if result.returncode != 0:
            partial.unlink(missing_ok=True)
            tail = "\n".join(build_log.read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(
                f"go build of Jaeger {JAEGER_VERSION} failed with exit code "
                f"{result.returncode} (full log: {build_log}):\n{tail}"
            )
        partial.replace(binary)
        _log.warning("built Jaeger in %.0fs", time.monotonic() - started)
        return binary

    @classmethod
    def start(
        cls,
        *,
        workdir: Path | None = None,
        timeout: float = 60.0,
        otlp_tls: tuple[Path, Path] | None = None,
        otlp_client_ca: Path | None = None,
    ) -> Self:
        """Build if needed, start Jaeger, and wait until its query API answers.

        The YAML config and ``jaeger.log`` are written into ``workdir`` (a new
        temporary directory by default, removed by :meth:`stop`; a failed start
        shows the log's tail in its error). ``otlp_tls``: a PEM certificate
        chain and key; the OTLP/HTTP receiver then serves HTTPS only
        (:attr:`otlp_http_endpoint` says ``https://``); ``otlp_client_ca``
        makes it require client certificates issued by that CA.
        """
        binary = cls.ensure_built()
        remove = workdir is None
        workdir = workdir or Path(tempfile.mkdtemp(prefix="leaseworker-jaeger-"))
        workdir.mkdir(parents=True, exist_ok=True)
        otlp_grpc, otlp_http, query_http, query_grpc = distinct_free_ports(4)
        config = workdir / "jaeger.yaml"
        config.write_text(
            _config_yaml(
                otlp_grpc=otlp_grpc,
                otlp_http=otlp_http,
                query_http=query_http,
                query_grpc=query_grpc,
                otlp_tls=otlp_tls,
                otlp_client_ca=otlp_client_ca,
            )
        )
        process = LocalProcess.spawn(
            "jaeger",
            [str(binary), "--config", f"file:{config}"],
            log_path=workdir / "jaeger.log",
        )
        jaeger = cls(
            otlp_grpc_port=otlp_grpc,
            otlp_http_port=otlp_http,
            query_http_port=query_http,
            query_grpc_port=query_grpc,
            workdir=workdir,
            process=process,
            remove_workdir=remove,
            otlp_https=otlp_tls is not None,
        )
        try:
            jaeger._wait_ready(timeout)
        except BaseException as exc:  # interrupted too (Ctrl-C, a test timeout): never leak it
            tail = process.log_tail()  # read before stop() removes the log
            jaeger.stop()
            if not isinstance(exc, Exception):
                raise
            raise RuntimeError(f"Jaeger did not start:\n{tail}") from exc
        return jaeger

    def stop(self) -> None:
        """Stop Jaeger by PID (its in-memory traces go with it) and remove its temp dir."""
        self.process.stop()
        if self.remove_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def find_traces(
        self, service: str, *, lookback_s: float = 600, limit: int = 100
    ) -> list[FoundSpan]:
        """Return the spans of ``service``'s traces from the last ``lookback_s`` seconds.

        Uses the OTLP-shaped API ``/api/v3/traces`` and falls back to the classic
        ``/api/traces`` when that route is missing. Each trace found contributes
        all its spans, including those of other services; spans come sorted by
        start time. No match is an empty list, not an error. ``limit`` caps the
        number of traces.
        """
        now = datetime.now(UTC)
        # Spans stamped a little ahead of this clock (another process, rounding)
        # still count, hence the slack at the upper bound.
        start_min, start_max = now - timedelta(seconds=lookback_s), now + timedelta(seconds=60)
        try:
            spans = self._find_v3(service, start_min, start_max, limit)
        except _RouteMissingError:
            spans = self._find_v1(service, start_min, start_max, limit)
        return sorted(spans, key=lambda s: (s["start_time_unix_nano"], s["span_id"]))

    def _find_v3(
        self, service: str, start_min: datetime, start_max: datetime, limit: int
    ) -> list[FoundSpan]:
        query = urllib.parse.urlencode(
            {
                "query.service_name": service,
                "query.start_time_min": _rfc3339(start_min),
                "query.start_time_max": _rfc3339(start_max),
                "query.num_traces": str(limit),
            }
        )
        status, body = http_get(f"{self.query_url}/api/v3/traces?{query}")
        if status == 404:
            if v3_found_nothing(body):
                return []
            raise _RouteMissingError
        if status != 200:
            raise RuntimeError(f"Jaeger /api/v3/traces answered {status}: {body[:500]!r}")
        return [_found(span) for span in spans_from_otlp(json.loads(body).get("result", {}))]

    def _find_v1(
        self, service: str, start_min: datetime, start_max: datetime, limit: int
    ) -> list[FoundSpan]:
        query = urllib.parse.urlencode(
            {
                "service": service,
                "start": str(int(start_min.timestamp() * 1_000_000)),
                "end": str(int(start_max.timestamp() * 1_000_000)),
                "limit": str(limit),
            }
        )
        status, body = http_get(f"{self.query_url}/api/traces?{query}")
        if status != 200:
            raise RuntimeError(f"Jaeger /api/traces answered {status}: {body[:500]!r}")
        return [_found_v1(span) for span in spans_from_v1(json.loads(body).get("data") or [])]

    def _wait_ready(self, timeout: float) -> None:
        """Wait for the query API, then for both OTLP receivers.

        The collector starts extensions (the query service) before the pipeline's
        receivers, so an answering query API alone does not mean spans are accepted.
        """
        deadline = time.monotonic() + timeout
        url = f"{self.query_url}/api/v3/services"
        while True:
            if self.process.popen.poll() is not None:
                raise RuntimeError(f"jaeger exited with {self.process.popen.returncode}")
            with contextlib.suppress(OSError):
                status, _ = http_get(url, timeout=1.0)
                if status == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not answer within {timeout}s")
            time.sleep(0.05)
        for port in (self.otlp_grpc_port, self.otlp_http_port):
            remaining = max(deadline - time.monotonic(), 0.1)
            wait_for_port(port, timeout=remaining, process=self.process.popen)


class _RouteMissingError(Exception):
    """The queried Jaeger has no such HTTP route."""


def _config_yaml(
    *,
    otlp_grpc: int,
    otlp_http: int,
    query_http: int,
    query_grpc: int,
    otlp_tls: tuple[Path, Path] | None = None,
    otlp_client_ca: Path | None = None,
) -> str:
    """Return the Jaeger v2 (OpenTelemetry Collector) config for a private instance.

    Only the OTLP receiver runs (no Jaeger/Zipkin receivers, no remote sampling,
    health-check, pprof or zpages extensions), every endpoint is an explicit
    loopback address, and ``metrics: level: none`` turns off the collector's own
    Prometheus endpoint, which would otherwise bind port 8888. The query service's
    self-tracing is off too: it would dial the default OTLP port 4317 (someone
    else's collector, or nothing, which delays shutdown by retries). With
    ``otlp_tls`` (certificate, key) the OTLP/HTTP receiver speaks TLS, and
    with ``otlp_client_ca`` it asks for client certificates.
    """
    tls = ""
    if otlp_tls is not None:
        cert, key = otlp_tls
        tls = f'\n        tls:\n          cert_file: "{cert}"\n          key_file: "{key}"'
        if otlp_client_ca is not None:
            tls += f'\n          client_ca_file: "{otlp_client_ca}"'
    return f"""\
# Written by leaseworker._dev._services.LocalJaeger; regenerated on every start.
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: info

extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: {MAX_TRACES}
  jaeger_query:
    storage:
      traces: memstore
    # On by default in v2: it would export Jaeger's own spans to localhost:4317.
    enable_tracing: false
    http:
      endpoint: "{LOOPBACK}:{query_http}"
    grpc:
      endpoint: "{LOOPBACK}:{query_grpc}"

receivers:
  otlp:
    protocols:
      grpc:
        endpoint: "{LOOPBACK}:{otlp_grpc}"
      http:
        endpoint: "{LOOPBACK}:{otlp_http}"{tls}

processors:
  batch:

exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"""


def _rfc3339(moment: datetime) -> str:
    """Format an aware UTC datetime the way Go's ``time.RFC3339Nano`` parses it."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _found(span: JaegerSpan, attributes: dict[str, Any] | None = None) -> FoundSpan:
    """Return ``span`` as a :class:`FoundSpan` (with ``attributes`` instead of its own)."""
    return FoundSpan(
        service=span.service,
        name=span.name,
        trace_id=span.trace_id,
        span_id=span.span_id,
        parent_span_id=span.parent_span_id,
        start_time_unix_nano=span.start_time_unix_nano,
        end_time_unix_nano=span.end_time_unix_nano,
        status=span.status,
        attributes=span.attributes if attributes is None else attributes,
    )


def _found_v1(span: JaegerSpan) -> FoundSpan:
    """Return a classic answer's span without the tags its OTLP translation added."""
    tags = {k: v for k, v in span.attributes.items() if k not in V1_SYNTHETIC_TAGS}
    if span.status == "error" and tags.get("error") is True:
        # The translation marks error spans with error=true; a real
        # attribute of that name and value is indistinguishable and dropped.
        del tags["error"]
    return _found(span, tags)
