"""Store URLs: which backend a URL selects, and how to show it without secrets.

``postgresql://user:password@host:port/db?...`` (or ``postgres://``) selects
PostgreSQL; the URL goes to libpq as is, so every libpq parameter works.
``sqlite:///path`` selects SQLite, following SQLAlchemy's spelling: everything
after the third slash is the path, so ``sqlite:///completions.db`` is relative
to the working directory and ``sqlite:////var/lib/lw/completions.db`` is
absolute; ``sqlite:///:memory:`` is a private in-memory database (tests).
``memory://`` selects the in-process store (no database, not durable, not
shared between pods: tests, demos, benchmarks).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from .._errors import ConfigError

DEFAULT_URL = "sqlite:///leaseworker-completions.sqlite3"
"""The embedded store used when no database URL is given."""

_PASSWORD_IN_NETLOC = re.compile(r"(://[^:/@?#]*:)[^@/?#]*@")
_PASSWORD_IN_QUERY = re.compile(r"(?i)((?:[?&]|^|\s)password=)[^&\s]*")


@dataclass(frozen=True, slots=True)
class StoreURL:
    """A parsed store URL: the backend, what to hand the driver, a loggable form."""

    backend: Literal["postgresql", "sqlite", "memory"]
    target: str = field(repr=False)  # may hold a password
    redacted: str


def redact(url: str) -> str:
    """Return ``url`` with any password replaced by ``***`` (userinfo and ``password=``)."""
    url = _PASSWORD_IN_NETLOC.sub(r"\1***@", url)
    return _PASSWORD_IN_QUERY.sub(r"\1***", url)


def parse_store_url(url: str | None) -> StoreURL:
    """Pick the backend for ``url`` (``None``: :data:`DEFAULT_URL`) or raise ConfigError."""
    if url is None:
        url = DEFAULT_URL
    if not isinstance(url, str):
        raise ConfigError(f"store URL must be a string, got {type(url).__name__}")
    shown = redact(url)
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if sep and scheme in {"postgresql", "postgres"}:
        _check_postgres(url, shown)
        return StoreURL("postgresql", url, shown)
    if sep and scheme == "sqlite":
        if not rest.startswith("/") or len(rest) == 1 or "?" in rest or "#" in rest:
            raise ConfigError(
                f"bad SQLite store URL {shown!r}: expected sqlite:///relative/path, "
                "sqlite:////absolute/path or sqlite:///:memory:"
            )
        return StoreURL("sqlite", rest[1:], shown)
    if sep and scheme == "memory":
        if rest:
            raise ConfigError(f"bad memory store URL {shown!r}: expected memory:// alone")
        return StoreURL("memory", "", shown)
    raise ConfigError(
        f"unsupported store URL {shown!r}: expected postgresql://..., sqlite:///path or memory://"
    )


def _check_postgres(url: str, shown: str) -> None:
    """Let libpq's own parser judge the URL, so errors surface at start, not at connect."""
    try:  # psycopg is optional: only a postgresql:// URL needs it, so only it imports it
        from psycopg import ProgrammingError
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:  # pragma: no cover - depends on the installation
        raise ConfigError(
            f"store URL {shown!r} needs psycopg: pip install 'leaseworker[postgres]'"
        ) from None
    try:
        params = conninfo_to_dict(url)
    except ProgrammingError:
        # ``from None``: libpq's message may echo the URL, password included.
        raise ConfigError(f"bad PostgreSQL store URL {shown!r}") from None
    # libpq parses values only when it connects, and a pod would retry that forever.
    for port in str(params.get("port", "")).split(","):
        if port and not (port.isdigit() and 1 <= int(port) <= 65535):
            raise ConfigError(f"bad PostgreSQL store URL {shown!r}: port {port!r} is not a port")
    for name, allowed in _POSTGRES_CHOICES.items():
        value = params.get(name)
        if value is not None and value not in allowed:
            raise ConfigError(
                f"bad PostgreSQL store URL {shown!r}: {name}={value!r} is not one of "
                + ", ".join(allowed)
            )


_POSTGRES_CHOICES: dict[str, tuple[str, ...]] = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": ("disable", "prefer", "require"),
    "target_session_attrs": (
        "any",
        "read-write",
        "read-only",
        "primary",
        "standby",
        "prefer-standby",
    ),
}
"""libpq parameters with a fixed set of values, checked before the first connection."""
