"""An OTLP/HTTP collector on HTTPS that keeps every export it is sent, byte for byte.

The secured end-to-end and leak tests point the pod's exporter here
(``OTEL_EXPORTER_OTLP_ENDPOINT``, verified against the test CA): the spans
arrive as leaseworker's OTLP/JSON, the metrics as the SDK's protobuf, and
the raw bodies are what the leak test searches. It answers 200 to all.
"""

from __future__ import annotations

import http.server
import json
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from leaseworker_dev._services._tls import TLSFiles


@dataclass
class Collector:
    """The running collector: its endpoint and what it was sent (path, body), in order."""

    endpoint: str
    exports: list[tuple[str, bytes]] = field(default_factory=list)

    def bodies(self, path: str) -> list[bytes]:
        """Return the bodies posted to ``path`` (``/v1/traces``, ``/v1/metrics``)."""
        return [body for sent, body in list(self.exports) if sent == path]

    def span_names(self) -> set[str]:
        """Return the names of the spans received (OTLP/JSON bodies; others skipped)."""
        names: set[str] = set()
        for body in self.bodies("/v1/traces"):
            try:
                request: dict[str, Any] = json.loads(body)
            except ValueError:
                continue
            for resource in request.get("resourceSpans", []):
                for scope in resource.get("scopeSpans", []):
                    names.update(span["name"] for span in scope.get("spans", []))
        return names

    def raw(self) -> bytes:
        """Every body received, concatenated (for searching)."""
        return b"\n".join(body for _, body in list(self.exports))


@contextmanager
def https_collector(identity: TLSFiles) -> Iterator[Collector]:
    """Serve a recording collector on a free loopback port with ``identity``'s certificate."""
    collector = Collector("")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            collector.exports.append((self.path, body))
            self.send_response(200)
            self.send_header("Content-Type", self.headers.get("Content-Type") or "")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            """Keep the test output quiet."""

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(identity.cert, identity.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    collector.endpoint = f"https://127.0.0.1:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield collector
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
