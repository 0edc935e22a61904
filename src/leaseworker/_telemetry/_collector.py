"""Asking the OTLP collector once at start whether it takes the pod's spans at all.

The SDK exporters post from a background thread and only log a refusal,
once per batch, forever: a collector that answers 401/403 (credentials in
``OTEL_EXPORTER_OTLP_HEADERS`` it does not accept) or whose certificate does
not verify against ``OTEL_EXPORTER_OTLP_CERTIFICATE`` loses every span
without the pod ever stopping. :func:`check_collector` posts one empty export
request through the span exporter's own HTTP client (same URL, headers, CA,
client certificate) and raises :class:`~leaseworker.ConfigError` for those
refusals; a collector that is down or slow is left to the exporter's
retries. Header values never appear in the message.
"""

from __future__ import annotations

import os
import ssl
import urllib.parse
from typing import Any

from .._errors import ConfigError
from ._export_seam import client_settings

REFUSING_STATUSES = (401, 403)
"""HTTP answers that say the collector will never take these credentials."""

CERTIFICATE_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE")
"""The SDK's variables for the collector's CA, the signal's own first."""

REQUESTS_CA_VARIABLES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
"""Variables through which requests replaces the CA the exporter was given."""

CHECK_BOUND = 5.0
"""The longest the start-up check waits for the collector."""


def check_collector(exporter: Any) -> None:
    """Raise ConfigError if the collector behind ``exporter`` refuses the pod (see module doc).

    ``exporter``: an SDK ``OTLPSpanExporter`` or leaseworker's JSON one, both
    posting through the SDK's OTLP HTTP client (read by ``_export_seam``);
    without one (another SDK version) nothing is checked.
    """
    settings = client_settings(exporter)
    if settings is None:
        return
    endpoint, headers = settings.endpoint, settings.headers
    json = any("json" in value for key, value in headers.items() if key.lower() == "content-type")
    timeout = CHECK_BOUND if settings.timeout is None else min(settings.timeout, CHECK_BOUND)
    try:
        result = settings.transport.request(
            "POST", endpoint, headers=headers, data=b"{}" if json else b"", timeout=timeout
        )
    except Exception:  # a transport that fails oddly is the exporter's to report
        return
    where = _without_credentials(endpoint)
    if result.status_code in REFUSING_STATUSES:
        raise ConfigError(
            f"the OTLP collector at {where} refused the pod's spans (HTTP {result.status_code}"
            f"{' ' + result.reason if result.reason else ''}): check the credentials in "
            "OTEL_EXPORTER_OTLP_HEADERS"
        )
    refusal = _tls_refusal(result.error)
    if refusal is not None:
        raise ConfigError(f"the OTLP collector at {where}: {refusal} ({_which_ca()})")


def _which_ca() -> str:
    """Say where the CA came from: requests lets its own variables win over the SDK's."""
    given = [name for name in CERTIFICATE_VARIABLES if os.environ.get(name)]
    bundle = [name for name in REQUESTS_CA_VARIABLES if os.environ.get(name)]
    if given and bundle:
        return f"{bundle[0]} is set and overrides {given[0]}: unset it"
    if given:
        return f"the CA is {given[0]}"
    return "verified against the system CAs: set OTEL_EXPORTER_OTLP_CERTIFICATE"


def _tls_refusal(error: BaseException | None) -> str | None:
    """Return why TLS failed if ``error`` (or what caused it) is a certificate refusal."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError):
            reason = getattr(current, "verify_message", None) or current
            return f"its TLS certificate is not accepted: {reason}"
        if isinstance(current, ssl.SSLError):
            return f"the TLS handshake failed: {getattr(current, 'reason', None) or current}"
        linked = [current.__cause__, current.__context__, getattr(current, "reason", None)]
        linked += current.args  # requests wraps urllib3's MaxRetryError, which holds the cause
        pending += [item for item in linked if isinstance(item, BaseException)]
    return None


def _without_credentials(url: str) -> str:
    """Return ``url`` without a ``user:password@`` part."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    netloc = parts.hostname or ""
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
