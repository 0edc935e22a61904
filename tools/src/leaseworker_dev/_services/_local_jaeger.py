"""A private Jaeger v2 on free loopback ports, with in-memory trace storage.

Built from source with the Go toolchain, pinned by the Go module in
``deploy/local/jaeger`` (shipped in the wheel too) and cached outside the
clone; its JSON query API is complete, its web UI is a placeholder.
See docs/design.md#development-services.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from leaseworker.toolkit import JaegerQuery, JaegerSpan, http_get, https_context

from ._proc import LOOPBACK, LocalProcess, cache_dir, distinct_free_ports, wait_for_port
from ._shipped import ToolMissingError, shipped

JAEGER_VERSION = "v1.75.0"
"""The Jaeger release pinned in ``deploy/local/jaeger/go.mod``."""

JAEGER_PACKAGE = "github.com/jaegertracing/jaeger/cmd/jaeger"
"""The Go package of the Jaeger v2 binary (an OpenTelemetry Collector distribution)."""

MAX_TRACES = 100_000
"""How many traces the in-memory store keeps before it drops the oldest."""

_log = logging.getLogger(__name__)


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
    query_ca: Path | None = None  # the query service serves HTTPS (``start(query_tls=...)``)

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
        scheme = "https" if self.query_ca is not None else "http"
        return f"{scheme}://{LOOPBACK}:{self.query_http_port}"

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
        query_tls: tuple[Path, Path, Path] | None = None,
    ) -> Self:
        """Build if needed, start Jaeger, and wait until its query API answers.

        The YAML config and ``jaeger.log`` are written into ``workdir`` (a new
        temporary directory by default, removed by :meth:`stop`; a failed start
        shows the log's tail in its error). ``otlp_tls``: a PEM certificate
        chain and key; the OTLP/HTTP receiver then serves HTTPS only
        (:attr:`otlp_http_endpoint` says ``https://``); ``otlp_client_ca``
        makes it require client certificates issued by that CA. ``query_tls``:
        certificate, key and the CA that issued them; the query service then
        serves HTTPS only (:attr:`query_url` says ``https://``).
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
                query_tls=query_tls[:2] if query_tls else None,
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
            query_ca=query_tls[2] if query_tls else None,
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
    ) -> list[JaegerSpan]:
        """Return the spans of ``service``'s traces from the last ``lookback_s`` seconds.

        Read by the one Jaeger reader (:meth:`JaegerQuery.service_spans`: the
        classic API, v3 where it is missing; a failure is a ``JaegerError``).
        Each trace found contributes all its spans, those of other services
        too, sorted by start time; no match is an empty list. ``limit`` caps
        the number of traces.
        """
        query = JaegerQuery(self.query_url, service=service, ca_file=self.query_ca)
        return query.service_spans(since=lookback_s, limit=limit)

    def _wait_ready(self, timeout: float) -> None:
        """Wait for the query API, then for both OTLP receivers.

        The collector starts extensions (the query service) before the pipeline's
        receivers, so an answering query API alone does not mean spans are accepted.
        """
        deadline = time.monotonic() + timeout
        url = f"{self.query_url}/api/v3/services"
        context = https_context(self.query_ca)
        while True:
            if self.process.popen.poll() is not None:
                raise RuntimeError(f"jaeger exited with {self.process.popen.returncode}")
            with contextlib.suppress(OSError):
                status, _ = http_get(url, timeout=1.0, context=context)
                if status == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not answer within {timeout}s")
            time.sleep(0.05)
        for port in (self.otlp_grpc_port, self.otlp_http_port):
            remaining = max(deadline - time.monotonic(), 0.1)
            wait_for_port(port, timeout=remaining, process=self.process.popen)


def _config_yaml(
    *,
    otlp_grpc: int,
    otlp_http: int,
    query_http: int,
    query_grpc: int,
    otlp_tls: tuple[Path, Path] | None = None,
    otlp_client_ca: Path | None = None,
    query_tls: tuple[Path, Path] | None = None,
) -> str:
    """Return the Jaeger v2 (OpenTelemetry Collector) config for a private instance.

    Only the OTLP receiver runs (no Jaeger/Zipkin receivers, no remote sampling,
    health-check, pprof or zpages extensions), every endpoint is an explicit
    loopback address, and ``metrics: level: none`` turns off the collector's own
    Prometheus endpoint, which would otherwise bind port 8888. The query service's
    self-tracing is off too: it would dial the default OTLP port 4317 (someone
    else's collector, or nothing, which delays shutdown by retries). With
    ``otlp_tls`` (certificate, key) the OTLP/HTTP receiver speaks TLS, and
    with ``otlp_client_ca`` it asks for client certificates; with
    ``query_tls`` the query service's HTTP endpoint does.
    """
    tls = ""
    if otlp_tls is not None:
        cert, key = otlp_tls
        tls = f'\n        tls:\n          cert_file: "{cert}"\n          key_file: "{key}"'
        if otlp_client_ca is not None:
            tls += f'\n          client_ca_file: "{otlp_client_ca}"'
    query = ""
    if query_tls is not None:
        cert, key = query_tls
        query = f'\n      tls:\n        cert_file: "{cert}"\n        key_file: "{key}"'
    return f"""\
# Written by leaseworker_dev._services.LocalJaeger; regenerated on every start.
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
      endpoint: "{LOOPBACK}:{query_http}"{query}
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
