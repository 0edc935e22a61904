"""``/healthz`` and ``/readyz`` for ``leaseworker run --health-port``: JSON probe endpoints.

Served by the standard library's HTTP server on a thread of its own, so a
probe answers while the event loop is stalled; handlers only read state the
loop publishes, never a client. See docs/design.md#health-and-loop-lag.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, final

import anyio

from .._errors import ConfigError
from .._kafka import SourceStats
from ._looplag import LoopLagMonitor
from ._worker import Pod, serve

logger = logging.getLogger("leaseworker.health")

HEALTH_PATH = "/healthz"
"""Liveness: the process answers and its event loop is not stalled."""

READY_PATH = "/readyz"
"""Readiness: joined the consumer group, and Redis answers."""

JOINED = ("assigned", "idle")
"""Group memberships in which a pod is ready (see :class:`SourceStats`)."""


@dataclass(frozen=True, slots=True)
class Response:
    """What a route returns: status code, content type, body."""

    status: int
    content_type: str
    body: bytes


Route = Callable[[], Response]


def json_response(status: int, document: dict[str, Any]) -> Response:
    """Build a JSON response (keys sorted, so the output is stable)."""
    body = json.dumps(document, sort_keys=True).encode()
    return Response(status, "application/json", body)


# -- the Redis probe ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RedisStatus:
    """The last PING's result: whether it answered, when (monotonic), and why not."""

    answered: bool
    at: float | None
    error: str | None


@final
class RedisProbe:
    """PING Redis every ``interval`` seconds on the event loop; keep the last result.

    ``ping`` must bound itself (``Pod.ping_redis`` does, by the Redis
    timeout); a result older than ``stale_after`` seconds counts as no answer,
    which also covers a loop too stalled to run the probe.
    """

    def __init__(
        self,
        ping: Callable[[], Awaitable[None]],
        *,
        interval: float = 2.0,
        stale_after: float = 6.0,
    ) -> None:
        self._ping = ping
        self._interval = interval
        self.stale_after = stale_after
        self._status = RedisStatus(answered=False, at=None, error="not probed yet")

    async def run(self) -> None:
        """Probe until cancelled."""
        while True:
            await self.probe()
            await anyio.sleep(self._interval)

    async def probe(self) -> None:
        """PING once and record the outcome (the error's type only: never a URL)."""
        try:
            await self._ping()
        except Exception as exc:  # any failure means "not ready"; record its type
            self._status = RedisStatus(answered=False, at=None, error=type(exc).__name__)
            return
        self._status = RedisStatus(answered=True, at=time.monotonic(), error=None)

    def read(self) -> RedisStatus:
        """Return the last result (safe to call from any thread)."""
        return self._status


# -- what the endpoints say ---------------------------------------------------------


@final
class PodHealth:
    """Turn the loop monitor, the Redis probe and the source's stats into probe answers."""

    def __init__(
        self,
        *,
        pod: str,
        monitor: LoopLagMonitor,
        redis: RedisProbe,
        kafka: SourceStats,
        stall_threshold: float,
    ) -> None:
        self._pod = pod
        self._monitor = monitor
        self._redis = redis
        self._kafka = kafka
        self._threshold = stall_threshold

    def healthz(self) -> Response:
        """200 ``ok`` unless the loop is stalled beyond the threshold (503 ``stalled``)."""
        lag = self._monitor.read()
        stalled = lag.current > self._threshold
        return json_response(
            503 if stalled else 200,
            {
                "status": "stalled" if stalled else "ok",
                "pod": self._pod,
                "loop_lag_seconds": round(lag.current, 4),
                "max_loop_lag_seconds": round(lag.max, 4),
                "stall_threshold_seconds": self._threshold,
                "stalls": lag.stalls,
            },
        )

    def readyz(self) -> Response:
        """200 ``ready`` once joined to the group and Redis answers; else 503 with reasons."""
        now = time.monotonic()
        kafka, redis = self._kafka, self._redis.read()
        reasons = []
        waiting_for = kafka.waiting_for
        if waiting_for is not None:
            reasons.append(waiting_for)
        if kafka.membership not in JOINED:
            reasons.append(f"kafka consumer is {kafka.membership}")
        redis_age = None if redis.at is None else now - redis.at
        if redis_age is None:
            reasons.append(f"redis did not answer ({redis.error})")
        elif redis_age > self._redis.stale_after:
            reasons.append(f"no redis answer for {redis_age:.1f}s")
        poll_age = None if kafka.last_poll_at is None else now - kafka.last_poll_at
        return json_response(
            503 if reasons else 200,
            {
                "status": "not_ready" if reasons else "ready",
                "pod": self._pod,
                "reasons": reasons,
                "kafka": {
                    "membership": kafka.membership,
                    "assigned_partitions": kafka.assigned_partitions,
                    "in_flight": kafka.in_flight,
                    "last_poll_age_seconds": _rounded(poll_age),
                },
                "waiting_for": waiting_for,
                "redis": {
                    "answered": redis.answered,
                    "last_answer_age_seconds": _rounded(redis_age),
                    "error": redis.error,
                },
            },
        )


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


# -- the HTTP server ----------------------------------------------------------------


@final
class HealthServer:
    """A small HTTP server on its own thread, serving GET/HEAD on registered paths.

    ::

        server = HealthServer("0.0.0.0", 8080)     # binds now: ConfigError if it cannot
        server.route("/healthz", health.healthz)
        server.start()
        ...
        server.close()

    Each request gets five seconds to arrive; unknown paths get
    404, a route that raises gets 500 (logged with the error type only).
    """

    def __init__(self, host: str, port: int) -> None:
        self._routes: dict[str, Route] = {}
        server_class = _Server6 if ":" in host else _Server
        try:
            self._server = server_class((host, port), _Handler)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        self._server.routes = self._routes
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (useful when 0 was asked for)."""
        return int(self._server.server_address[1])

    def route(self, path: str, handler: Route) -> None:
        """Serve ``handler()`` at ``path`` (exact match; the query string is ignored)."""
        self._routes[path] = handler

    def start(self) -> None:
        """Start serving on a daemon thread."""
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="leaseworker-health",
            daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving and close the socket (waits at most one poll interval)."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    routes: dict[str, Route]


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = 5.0  # seconds a client gets to send its request
    server_version = "leaseworker"
    sys_version = ""

    def do_GET(self) -> None:
        """Answer a probe."""
        self._answer(with_body=True)

    def do_HEAD(self) -> None:
        """Answer a probe without a body."""
        self._answer(with_body=False)

    def _answer(self, *, with_body: bool) -> None:
        path = self.path.split("?", 1)[0]
        route = self.server.routes.get(path)
        if route is None:
            response = json_response(404, {"error": "not found"})
        else:
            try:
                response = route()
            except Exception as exc:  # a broken route must not take the server down
                logger.exception("health route %s failed: %s", path, type(exc).__name__)
                response = json_response(500, {"error": type(exc).__name__})
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if with_body:
            self.wfile.write(response.body)

    def log_message(self, format: str, *args: Any) -> None:
        """Probes arrive every few seconds: log them at debug level, not to stderr."""
        logger.debug("health request: " + format, *args)


# -- running a pod with its endpoints -------------------------------------------------


async def serve_with_health(
    worker: Pod,
    server: HealthServer,
    *,
    pod: str,
    stall_threshold: float,
) -> None:
    """Run :func:`serve` for ``worker`` with ``/healthz`` and ``/readyz`` on ``server``.

    Starts the loop-lag monitor and the Redis probe beside the worker, and the
    server's thread; the caller closes ``server`` after this returns.
    """
    monitor = LoopLagMonitor(stall_threshold=stall_threshold)
    redis = RedisProbe(worker.ping_redis)
    health = PodHealth(
        pod=pod, monitor=monitor, redis=redis, kafka=worker.stats, stall_threshold=stall_threshold
    )
    server.route(HEALTH_PATH, health.healthz)
    server.route(READY_PATH, health.readyz)
    server.start()
    logger.info(
        "health endpoints on port %d: %s, %s",
        server.port,
        HEALTH_PATH,
        READY_PATH,
        extra={"event": "health_listening", "pod": pod},
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(monitor.run)
        tg.start_soon(redis.run)
        await serve(worker)
        tg.cancel_scope.cancel()
