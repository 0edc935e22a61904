"""One URL for every Redis topology: parse it, redact it, build its client.

``redis://`` and ``rediss://`` (one node, TLS), ``unix://``,
``redis+sentinel://`` (a Sentinel-monitored master) and ``redis+cluster://``
(a Redis Cluster), each also with TLS as ``rediss+...``. The CLI, the health
probe and embedding code all build their client here, with leaseworker's
socket settings. TLS files travel as query options of every topology
(``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``: redis-py's names), and a
URL kept in a file gives credentials read again for every new connection.
See docs/operations.md#redis-topology.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, quote, unquote, urlsplit

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import Sentinel
from redis.connection import parse_url
from redis.credentials import CredentialProvider

from .._errors import ConfigError
from .._secrets import SecretFile

Topology = Literal["single", "sentinel", "cluster"]
"""Which Redis deployment a URL names."""

_SCHEMES: dict[str, tuple[Topology, bool]] = {
    "redis": ("single", False),
    "rediss": ("single", True),
    "unix": ("single", False),
    "redis+sentinel": ("sentinel", False),
    "rediss+sentinel": ("sentinel", True),
    "redis+cluster": ("cluster", False),
    "rediss+cluster": ("cluster", True),
}
_SENTINEL_OPTIONS = {"sentinel_username", "sentinel_password"}
TLS_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
"""The TLS files a URL may name (redis-py's option names), on every topology."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RedisTarget:
    """A parsed lease Redis URL: the topology, its hosts and how to log it.

    ``username``/``password`` are the data nodes' (master, replicas, cluster
    nodes); a Sentinel URL's ``sentinel_username``/``sentinel_password`` query
    options are the sentinels' own, for deployments that protect them apart.
    """

    url: str = field(repr=False)  # may hold a password
    topology: Topology
    tls: bool
    hosts: tuple[tuple[str, int], ...]
    service: str | None = None
    db: int = 0
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    sentinel_username: str | None = field(default=None, repr=False)
    sentinel_password: str | None = field(default=None, repr=False)
    tls_files: dict[str, str] = field(default_factory=dict)

    @property
    def default_replicas(self) -> int:
        """Replicas a lease waits for unless told otherwise: 1 on Sentinel and Cluster."""
        return 0 if self.topology == "single" else 1

    def redacted(self) -> str:
        """Where it points, for log lines: never a password."""
        if self.topology == "single":
            parts = urlsplit(self.url)
            if parts.scheme == "unix":
                return f"unix:{parts.path}"
            return f"{parts.hostname or '?'}:{parts.port or 6379}"
        hosts = ",".join(f"{host}:{port}" for host, port in self.hosts)
        return f"{self.topology} {hosts}" + (f" ({self.service})" if self.service else "")


def parse_redis_url(url: str) -> RedisTarget:
    """Parse ``url``, or raise :class:`ConfigError` with a reason that never quotes it."""
    scheme = url.partition("://")[0].lower()
    if scheme not in _SCHEMES:
        raise ConfigError(
            "redis_url must be redis://, rediss://, unix://, redis+sentinel:// "
            "or redis+cluster:// (rediss+... for TLS)"
        )
    topology, tls = _SCHEMES[scheme]
    if topology == "single":
        return _single(url, tls)
    return _multi(url, topology, tls)


def redis_from_url(
    url: str, *, connect_timeout: float = 0.5, url_file: Path | None = None
) -> Redis | RedisCluster:
    """Build the client for a lease Redis URL of any topology, as ``leaseworker run`` does.

    ``socket_timeout`` is off: :class:`RedisLeases` bounds every call itself (and
    redis-py's read timeout would add a timer per read and a task per write);
    ``connect_timeout`` bounds each connection attempt. A Sentinel URL gives a
    master client that follows failovers; a cluster URL a ``RedisCluster``.
    ``url_file``: the file ``url`` was read from; every new connection reads
    the user and password from it again (a rotated Secret).
    """
    target = parse_redis_url(url)
    common: dict[str, Any] = {"socket_timeout": None, "socket_connect_timeout": connect_timeout}
    auth: dict[str, Any] = {"username": target.username, "password": target.password}
    if url_file is not None:
        auth = {"credential_provider": FileCredentials(SecretFile(url_file, "redis_url_file"))}
    tls: dict[str, Any] = {"ssl": True, **target.tls_files} if target.tls else {}
    if target.topology == "single":
        if url_file is None:
            return Redis.from_url(url, **common)  # the URL carries AUTH and TLS options
        return Redis.from_url(_without_userinfo(url), **common, **auth)
    if target.topology == "cluster":
        nodes = [ClusterNode(host, port) for host, port in target.hosts]
        return RedisCluster(startup_nodes=nodes, **tls, **auth, **common)
    sentinel_auth: dict[str, Any] = {
        "username": target.sentinel_username,
        "password": target.sentinel_password,
        **tls,
        "socket_timeout": connect_timeout,  # a sentinel answers at once or not at all
        "socket_connect_timeout": connect_timeout,
    }
    sentinel = Sentinel(list(target.hosts), sentinel_kwargs=sentinel_auth)  # type: ignore[no-untyped-call]
    assert target.service is not None
    master: Redis = sentinel.master_for(
        target.service, redis_class=_SentinelMaster, db=target.db, **tls, **auth, **common
    )
    return master


def with_tls_files(url: str, files: dict[str, str | None]) -> str:
    """Return ``url`` with the TLS files of ``files`` (``ssl_ca_certs`` ...) as query options.

    For ``--redis-ca-file``, ``--redis-cert-file`` and ``--redis-key-file``; an
    option the URL sets already is kept.
    """
    given = {name: path for name, path in files.items() if path}
    if not given:
        return url
    if not parse_redis_url(url).tls:
        raise ConfigError("Redis TLS files are given but the URL is not rediss://... (TLS)")
    query = url.partition("?")[2]
    present = set(parse_qs(query))
    extra = "&".join(f"{k}={quote(v, safe='/')}" for k, v in given.items() if k not in present)
    if not extra:
        return url
    return f"{url}{'&' if query else '?'}{extra}"


class FileCredentials(CredentialProvider):
    """Redis credentials read from the URL in a file each time a connection authenticates."""

    def __init__(self, source: SecretFile) -> None:
        self._source = source

    def get_credentials(self) -> tuple[str] | tuple[str, str]:
        target = parse_redis_url(self._source.read())
        if target.username:
            return (target.username, target.password or "")
        return (target.password or "",)

    async def get_credentials_async(self) -> tuple[str] | tuple[str, str]:
        return self.get_credentials()  # a small local file: read at once


def _without_userinfo(url: str) -> str:
    scheme, _, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    return f"{scheme}://{netloc.rpartition('@')[2]}{slash}{path}"


class _SentinelMaster(Redis):
    """A Sentinel master client whose ``aclose()`` also closes its sentinel connections.

    redis-py leaves them to the ``Sentinel`` object, which :func:`redis_from_url`
    does not hand out: without this they would leak on every close.
    """

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        try:
            await super().aclose(close_connection_pool)
        finally:
            manager = getattr(self.connection_pool, "sentinel_manager", None)
            for sentinel in getattr(manager, "sentinels", ()):
                await sentinel.aclose()


def _single(url: str, tls: bool) -> RedisTarget:
    try:
        options = parse_url(url)  # type: ignore[no-untyped-call]  # what from_url refuses
    except ValueError:
        # Not redis-py's message: it may quote the URL, password included.
        raise ConfigError(
            "redis_url is not a valid Redis URL (check its port and database)"
        ) from None
    host = options.get("host") or options.get("path") or "?"
    return RedisTarget(
        url=url,
        topology="single",
        tls=tls,
        hosts=((str(host), int(options.get("port") or 6379)),),
        db=int(options.get("db") or 0),
        username=options.get("username"),
        password=options.get("password"),
        tls_files={k: str(options[k]) for k in TLS_OPTIONS if options.get(k)},
    )


def _multi(url: str, topology: Topology, tls: bool) -> RedisTarget:
    rest = url.partition("://")[2]
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, _, hostlist = netloc.rpartition("@")
    username, _, password = userinfo.partition(":") if userinfo else ("", "", "")
    hosts = tuple(_host(item) for item in hostlist.split(","))
    options = _options(query, topology)
    segments = [unquote(s) for s in path.split("/") if s]
    service, db = _service_and_db(segments, topology)
    return RedisTarget(
        url=url,
        topology=topology,
        tls=tls,
        hosts=hosts,
        service=service,
        db=db,
        username=unquote(username) or None,
        password=unquote(password) or None,
        sentinel_username=options.get("sentinel_username"),
        sentinel_password=options.get("sentinel_password"),
        tls_files={k: options[k] for k in TLS_OPTIONS if k in options},
    )


def _host(item: str) -> tuple[str, int]:
    host, _, port = item.strip().rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError("redis_url: every host must be host:port (with a port from 1 to 65535)")
    return host.strip("[]"), int(port)


def _options(query: str, topology: Topology) -> dict[str, str]:
    options = {name: values[-1] for name, values in parse_qs(query).items()}
    allowed = {*TLS_OPTIONS, *(_SENTINEL_OPTIONS if topology == "sentinel" else ())}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ConfigError(f"redis_url: unknown option(s) {', '.join(unknown)} for {topology}")
    return options


def _service_and_db(segments: list[str], topology: Topology) -> tuple[str | None, int]:
    if topology == "cluster":
        if segments:
            raise ConfigError("redis_url: a cluster URL has no path (a cluster has one database)")
        return None, 0
    if not segments or len(segments) > 2:
        raise ConfigError("redis_url: a Sentinel URL ends in /<service>[/<db>]")
    if len(segments) == 2 and not segments[1].isdigit():
        raise ConfigError("redis_url: the database after the Sentinel service must be a number")
    return segments[0], int(segments[1]) if len(segments) == 2 else 0
