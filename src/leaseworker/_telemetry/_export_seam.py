"""The exporter seam: every OpenTelemetry name the span export uses beyond the public API.

``leaseworker run`` exports its spans on a fast path (lean spans, span records,
the lean batch processor, OTLP/JSON; bench/README.md#telemetry-overhead says
what each saves). Three of its needs have no public name in OpenTelemetry; each
is read here and nowhere else in ``_telemetry``, with the reason it is kept:

- **The instrumentation suppression key** (``opentelemetry.context.
  _SUPPRESS_INSTRUMENTATION_KEY``; the API calls its place temporary). The
  lean batch processor (``_span_batch``) exports with it set, as the SDK's own
  processors do, so that an instrumented HTTP library does not trace the
  exporter's posts (a span per export, itself exported). That processor is
  what takes span records (``_span_records``: six of a trigger's seven spans made
  without a span object on the event loop) and queues a span with one deque
  append; the SDK's ``BatchSpanProcessor`` takes span objects only.
- **The OTLP/HTTP span exporter's HTTP client** (``OTLPSpanExporter._client``,
  whose ``export(body)`` posts bytes with the exporter's endpoint, headers, TLS
  files, compression, timeout and retries, all read from ``OTEL_EXPORTER_OTLP_*``).
  The JSON exporter (``_otlp_json``) posts its body through it: it writes
  OTLP/JSON text from cached pieces (a trigger's seven spans in 40-45 µs)
  where the SDK's exporter builds protobuf objects in Python, in the export
  thread that takes the GIL from the event loop; and it reads none of those
  variables a second time. The start-up
  collector check (``_collector``) reads the client's transport, endpoint,
  headers and timeout to post one empty request exactly as the exports will.
- **``SpanContext``'s tuple layout.** The lean tracer and the JSON encoder read
  several fields of every span's context; ``tuple(context)`` copies them in C
  instead of a property call per field. The layout is probed at import
  (:data:`TUPLE_LAYOUT`, against the properties): any other layout is read
  field by field (:func:`by_property`), whatever the versions, so the probe is
  its whole check.

:func:`fast_path_fits` is asked once at set-up (``_setup``): the installed
opentelemetry-api, -sdk and -exporter-otlp-proto-http must be the releases
these were read from and tested with (:data:`TESTED_RELEASES`, the pins of
constraints.txt), and the suppression key must be there. Otherwise it logs
one WARNING and the set-up stands down to the public path: the SDK's
``BatchSpanProcessor`` and OTLP/protobuf exporter (the lean tracer provider,
public names only, stays: it keeps exception messages out of spans), no span
records, no collector check at start. The client's shape is checked where it
is taken (:func:`otlp_http_client`, :func:`client_settings`): without it the
JSON exporter is refused (``_setup`` then warns and posts protobuf) and the
collector is not asked. Before widening the range, run tests/telemetry (the
lean and JSON encodings are compared with the SDK's there) and
tests/security/test_otlp_ssl.py (the collector check).

Not private, so not here: enum members' ``_value_`` (Python's enum documents
it) read by the encoder, ``LeanSpan`` standing in for the SDK's
``ReadableSpan`` (the attributes that interface documents), and the sampler's
``get_description()`` text the lean provider reads (any other text: the
sampler is asked). Only the OpenTelemetry API is imported here: the package
imports this module.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any, cast, final

import opentelemetry.context as otel_context
from opentelemetry.context import Context
from opentelemetry.trace import SpanContext, TraceFlags, TraceState

logger = logging.getLogger("leaseworker.telemetry")

TESTED_RELEASES = ((1, 45), (1, 46))
"""The OpenTelemetry releases the fast path was read from (major, minor; from, to exclusive)."""

DISTRIBUTIONS = ("opentelemetry-api", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http")
"""The distributions whose private names or layout the fast path uses (they release together)."""

_SUPPRESS_KEY_NAME = "_SUPPRESS_INSTRUMENTATION_KEY"


# -- the versions, checked once at set-up --------------------------------------------------


def installed_version(distribution: str) -> str | None:
    """Return the installed version of ``distribution``, or ``None`` if it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def misfits() -> list[str]:
    """Say what differs from what the fast path was read from (empty: nothing)."""
    found: list[str] = []
    low, high = TESTED_RELEASES
    for distribution in DISTRIBUTIONS:
        version = installed_version(distribution)
        try:
            release = tuple(int(part) for part in (version or "").split(".")[:2])
        except ValueError:
            release = ()
        if not low <= release < high:
            found.append(f"{distribution} {version or 'not installed'}")
    if not isinstance(_suppress_key(), str):
        found.append(f"opentelemetry.context has no {_SUPPRESS_KEY_NAME}")
    return found


_STOOD_DOWN: set[str] = set()
"""What was already warned about (one WARNING per process and kind of misfit)."""


def fast_path_fits() -> bool:
    """Whether the installed OpenTelemetry is the one the fast path was read from (else: warn)."""
    found = misfits()
    if not found:
        return True
    said = "; ".join(found)
    if said not in _STOOD_DOWN:
        _STOOD_DOWN.add(said)
        logger.warning(
            "%s: not the OpenTelemetry %d.%d leaseworker's span export was read from; "
            "exporting through the SDK's batch processor and OTLP/protobuf exporter "
            "(every span a span object, no collector check at start)",
            said,
            *TESTED_RELEASES[0],
        )
    return False


# -- the instrumentation suppression key ---------------------------------------------------


def _suppress_key() -> object:
    return getattr(otel_context, _SUPPRESS_KEY_NAME, None)


def suppressing_instrumentation() -> Context:
    """Return the current context with instrumentation suppressed, for an export to run in.

    Without the key (an API :func:`fast_path_fits` refuses; only a processor
    built by hand gets here), the current context as it is.
    """
    key = _suppress_key()
    if not isinstance(key, str):
        return otel_context.get_current()
    return otel_context.set_value(key, True)


# -- the OTLP/HTTP exporter's client ---------------------------------------------------------


def otlp_http_client(exporter: Any) -> Any | None:
    """Return the HTTP client of an SDK ``OTLPSpanExporter`` (or of ``_otlp_json``'s exporter).

    ``None`` when it has none with an ``export(body)`` method (another release).
    """
    client = getattr(exporter, "_client", None)
    return client if callable(getattr(client, "export", None)) else None


@final
@dataclass(frozen=True, slots=True)
class ClientSettings:
    """What an OTLP HTTP client posts with: the collector check asks the same way."""

    transport: Any
    """Has ``request(method, url, headers=, data=, timeout=)``, answering ``status_code``,
    ``reason`` and ``error``."""
    endpoint: str
    headers: dict[str, str]
    timeout: float | None
    """The exporter's timeout in seconds (``None``: the client does not say)."""


def client_settings(exporter: Any) -> ClientSettings | None:
    """Return the settings of ``exporter``'s HTTP client; ``None`` without one (another release)."""
    client = getattr(exporter, "_client", None)
    transport = getattr(client, "_transport", None)
    endpoint = getattr(client, "_endpoint", None)
    if transport is None or not isinstance(endpoint, str):
        return None
    timeout = getattr(client, "_timeout", None)
    return ClientSettings(
        transport=transport,
        endpoint=endpoint,
        headers=dict(getattr(client, "_headers", {})),
        timeout=None if timeout is None else float(timeout),
    )


# -- a span context's fields ---------------------------------------------------------------

Fields = tuple[int, int, bool, TraceFlags, TraceState, bool]
"""trace id, span id, is remote, trace flags, trace state, is valid."""


def by_property(context: SpanContext) -> Fields:
    """Return the fields through the API's properties (the reference)."""
    return (
        context.trace_id,
        context.span_id,
        context.is_remote,
        context.trace_flags,
        context.trace_state,
        context.is_valid,
    )


def _layout_is_the_tuple() -> bool:
    probe = SpanContext(1, 2, True, TraceFlags(1), TraceState([("k", "v")]))
    return tuple(probe) == by_property(probe)


TUPLE_LAYOUT = _layout_is_the_tuple()
"""Whether ``SpanContext`` is the tuple of :data:`Fields` (checked once, at import)."""

fields = cast(Callable[[SpanContext], Fields], tuple) if TUPLE_LAYOUT else by_property
"""Return a span context's fields: with the known layout, ``tuple`` copies them in C.

Callers look it up on this module at each call, so a test can swap in :func:`by_property`.
"""
