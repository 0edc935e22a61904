"""One Redis URL for every topology: parsing, redaction, defaults and the client built."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis, RedisCluster

from leaseworker import ConfigError, PodConfig, redis_from_url
from leaseworker._lease import parse_redis_url

pytestmark = pytest.mark.fake  # parsing only: no server is contacted


def test_a_single_node_url_keeps_its_host_db_and_credentials() -> None:
    """``redis://`` and ``rediss://`` parse as one node; no replica wait by default."""
    target = parse_redis_url("rediss://app:s3cret@cache.internal:6380/2")
    assert (target.topology, target.tls, target.hosts, target.db) == (
        "single",
        True,
        (("cache.internal", 6380),),
        2,
    )
    assert (target.username, target.password) == ("app", "s3cret")
    assert target.default_replicas == 0
    assert target.redacted() == "cache.internal:6380"


def test_a_sentinel_url_names_its_sentinels_service_db_and_both_credentials() -> None:
    """Userinfo is the master's; ``sentinel_*`` options are the sentinels' own."""
    target = parse_redis_url(
        "redis+sentinel://app:pw@s1:26379,s2:26380,[::1]:26381/reports/3"
        "?sentinel_username=watch&sentinel_password=spw"
    )
    assert target.topology == "sentinel"
    assert target.hosts == (("s1", 26379), ("s2", 26380), ("::1", 26381))
    assert (target.service, target.db) == ("reports", 3)
    assert (target.username, target.password) == ("app", "pw")
    assert (target.sentinel_username, target.sentinel_password) == ("watch", "spw")
    assert target.default_replicas == 1
    assert "pw" not in target.redacted()
    assert "reports" in target.redacted()
    assert "pw" not in repr(target)


def test_a_cluster_url_names_its_startup_nodes() -> None:
    """``redis+cluster://`` takes host:port pairs and no database."""
    target = parse_redis_url("rediss+cluster://:pw@n1:7000,n2:7001")
    assert (target.topology, target.tls, target.hosts) == (
        "cluster",
        True,
        (("n1", 7000), ("n2", 7001)),
    )
    assert target.password == "pw"
    assert target.default_replicas == 1


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://h:1", "must be redis://"),
        ("redis://:s3cret@h:notaport/0", "not a valid Redis URL"),
        ("redis+sentinel://:s3cret@h:26379", "ends in /<service>"),
        ("redis+sentinel://:s3cret@h:26379/svc/x", "must be a number"),
        ("redis+sentinel://:s3cret@h/svc", "host:port"),
        ("redis+sentinel://:s3cret@h:26379/svc?bogus=1", "unknown option"),
        ("redis+cluster://:s3cret@h:7000/0", "no path"),
        ("redis+cluster://:s3cret@h:99999", "host:port"),
    ],
)
def test_a_bad_url_is_one_line_that_never_quotes_the_password(url: str, reason: str) -> None:
    """Each malformed URL gets its reason; the password never appears in it."""
    with pytest.raises(ConfigError, match=reason) as refused:
        parse_redis_url(url)
    assert "s3cret" not in str(refused.value)
    assert "\n" not in str(refused.value)


async def test_the_client_fits_the_topology_with_no_socket_timeout() -> None:
    """One node: ``Redis``; a cluster: ``RedisCluster``; a Sentinel URL: a master client."""
    single = redis_from_url("redis://127.0.0.1:1/0", connect_timeout=0.3)
    assert isinstance(single, Redis)
    kwargs = single.connection_pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (None, 0.3)
    await single.aclose()
    assert isinstance(redis_from_url("redis+cluster://127.0.0.1:1"), RedisCluster)
    master = redis_from_url("redis+sentinel://127.0.0.1:1/svc")
    assert isinstance(master, Redis)
    await master.aclose()


def test_the_pod_waits_for_a_replica_on_replicated_urls_unless_told_otherwise() -> None:
    """``lease_replicas`` unset: 1 on Sentinel and Cluster, 0 on one node; 0 can be chosen."""
    assert PodConfig().replicas == 0
    assert PodConfig(redis_url="redis+sentinel://h:26379/svc").replicas == 1
    assert PodConfig(redis_url="redis+cluster://h:7000").replicas == 1
    assert PodConfig(redis_url="redis+cluster://h:7000", lease_replicas=0).replicas == 0
    assert PodConfig(redis_url="redis+cluster://h:7000").redacted_redis() == "cluster h:7000"
    with pytest.raises(ConfigError, match="lease_replicas"):
        PodConfig(lease_replicas=-1)
