"""Redis over TLS with the documented ACL user: one node, a Sentinel group, a Cluster.

Each topology serves TLS only and asks for client certificates. The lease
calls work as the ACL user through each; every refusal a pod meets at start
(a password, a command the ACL lacks, a certificate, a cluster node behind a
one-node URL) exits 2 within 10 s with one line naming Redis and the reason.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from leaseworker import RedisLeases
from leaseworker._lease import check_redis, parse_redis_url, redis_from_url
from leaseworker_dev._services import LocalRedis, RedisNode, ServiceTLS, TestCA, free_port

from ..health_util import spawn
from ..waiting import eventually
from .cli import JOB, run_pod
from .conftest import SecureRedis, documented_acl


async def test_tls_leases_work_under_the_documented_acl(secured: SecureRedis) -> None:
    """Acquire, renew, inspect, release and the start-up checks, as the ACL user, over TLS."""
    url = secured.url()
    target = parse_redis_url(url)
    client = redis_from_url(url, connect_timeout=2.0)
    leases = RedisLeases(
        client, command_timeout=2.0, replicas=target.default_replicas, owner_prefix="tls"
    )
    try:
        await check_redis(client, leases, target=target, where=target.redacted(), bound=2.0)
        key = f"tls:{uuid.uuid4().hex[:8]}"
        lease = await leases.acquire(key, 5.0)
        assert lease is not None
        lease = await leases.renew(lease)
        assert (await leases.inspect(key)).fence == lease.fence
        assert await leases.release(lease)
    finally:
        await leases.aclose()
        await client.aclose()


def test_tls_wrong_password_exits_2(redis_tls: SecureRedis) -> None:
    """WRONGPASS over TLS: the existing credentials refusal, never the password."""
    ended = run_pod("--redis-url", redis_tls.url(password="not-it-7c1"), "--store-url", "memory://")
    line = ended.refusal()
    assert "refused the credentials" in line
    assert "not-it-7c1" not in ended.stderr


def test_tls_nopermission_on_a_command_the_pod_needs_exits_2_naming_it(
    redis_tls: SecureRedis,
) -> None:
    """The documented ACL without ``+pexpire`` (renewals): the start-up probe names it."""
    user, password = f"lw-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    argv = [arg for arg in documented_acl(user, password)[2:] if arg != "+pexpire"]
    redis_tls.set_user(*argv)
    url = redis_tls.url(user=user, password=password)
    line = run_pod("--redis-url", url, "--store-url", "memory://").refusal()
    assert "refused a command the pod needs (NOPERM)" in line
    assert "pexpire" in line
    assert password not in line


def test_tls_no_client_certificate_exits_2_naming_redis_and_the_certificate(
    redis_tls: SecureRedis,
) -> None:
    """``tls-auth-clients yes`` and no certificate given: a refusal, not an outage to wait out."""
    bare = redis_tls.url().partition("?")[0]
    url = f"{bare}?ssl_ca_certs={redis_tls.tls.server.ca}"
    ended = run_pod("--redis-url", url, "--store-url", "memory://")
    line = ended.refusal()
    assert "Redis at 127.0.0.1:" in line
    assert "client certificate" in line
    assert redis_tls.password not in ended.stderr


def test_tls_an_acl_without_ping_exits_2_naming_it(redis_tls: SecureRedis) -> None:
    """The readiness PING is a command the pod needs too: NOPERM on it is no outage."""
    user, password = f"lw-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    redis_tls.set_user(*[arg for arg in documented_acl(user, password)[2:] if arg != "+ping"])
    line = run_pod("--redis-url", redis_tls.url(user=user, password=password)).refusal()
    assert "refused a command the pod needs (NOPERM)" in line
    assert "ping" in line


def test_tls_unknown_ca_exits_2(redis_tls: SecureRedis, other_ca: TestCA) -> None:
    """A CA the server's certificate does not chain to: OpenSSL's reason, at once."""
    url = redis_tls.url().replace(str(redis_tls.tls.server.ca), str(other_ca.ca_file))
    line = run_pod("--redis-url", url, "--store-url", "memory://").refusal()
    assert "refused the connection: TLS certificate refused" in line


@pytest.fixture(params=["expired", "other-host"])
def misissued_redis(request: pytest.FixtureRequest, test_ca: TestCA) -> Iterator[LocalRedis]:
    """A TLS Redis with an expired certificate, or one for another host."""
    if request.param == "expired":
        server_files = test_ca.server(expired=True)
    else:
        server_files = test_ca.server(hosts=("redis.invalid",))
    tls = ServiceTLS(server=server_files, client=test_ca.client("leaseworker"))
    server = LocalRedis.start(tls=tls)
    yield server
    server.stop()


def test_tls_expired_or_misnamed_server_certificate_exits_2(misissued_redis: LocalRedis) -> None:
    """The client refuses both; the line names Redis and OpenSSL's reason."""
    line = run_pod("--redis-url", misissued_redis.url, "--store-url", "memory://").refusal()
    assert f"Redis at 127.0.0.1:{misissued_redis.port} refused the connection" in line
    assert any(
        reason in line
        for reason in ("certificate has expired", "mismatch, certificate is not valid for")
    )


def test_tls_one_node_url_at_a_cluster_node_exits_2_naming_redis_cluster(
    cluster_tls: tuple[SecureRedis, list[RedisNode]],
) -> None:
    """rediss://node would serve one shard's keys and retry the others on MOVED forever."""
    topology, nodes = cluster_tls
    query = topology.base_url.partition("?")[2]
    url = f"rediss://{topology.user}:{topology.password}@127.0.0.1:{nodes[0].port}/0?{query}"
    line = run_pod("--redis-url", url, "--store-url", "memory://").refusal()
    assert "is a Redis Cluster node (it answered MOVED): use redis+cluster://" in line


def test_the_probe_tries_every_command_the_lease_scripts_run() -> None:
    """A script's NOPERM does not name its command; the probe's list must cover the scripts."""
    from leaseworker._lease import _scripts
    from leaseworker._lease._probe import _SCRIPT_COMMANDS

    used = set()
    for script in (_scripts.ACQUIRE, _scripts.RENEW, _scripts.RELEASE):
        used |= set(re.findall(r"redis\.call\('([A-Z]+)'", script))
    assert used
    assert used <= {*_SCRIPT_COMMANDS, "TIME"}


def test_tls_sentinel_acl_without_wait_exits_2_naming_it(sentinel_tls: SecureRedis) -> None:
    """A refused WAIT would read as "0 replicas acknowledged" forever: the probe asks it alone."""
    user, password = f"lw-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    sentinel_tls.set_user(*[a for a in documented_acl(user, password)[2:] if a != "+wait"])
    url = sentinel_tls.url(user=user, password=password)
    line = run_pod("--redis-url", url, "--store-url", "memory://").refusal()
    assert "refused a command the pod needs (NOPERM)" in line
    assert "'wait'" in line


async def test_tls_redis_that_is_not_up_is_waited_for_with_a_warning_per_attempt(
    redis_tls: SecureRedis, tmp_path: Path
) -> None:
    """Nothing listens on the port yet: no TLS refusal, the pod keeps waiting and says so."""
    url = redis_tls.url().replace(f":{redis_tls.ports[0]}/", f":{free_port()}/")
    pod = spawn(
        "waiting", JOB, tmp_path, {"LEASEWORKER_REDIS_URL": url}, "--store-url", "memory://"
    )
    try:

        async def warned_twice() -> bool:
            return pod.log_text().count("unavailable (ConnectionError); retrying in") >= 2

        await eventually(warned_twice, within=30)
        assert pod.process.poll() is None  # still waiting, not exited
    finally:
        pod.kill()
    assert redis_tls.password not in pod.log_text()
