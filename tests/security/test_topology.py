"""A one-node URL at a Redis Cluster node: refused at start instead of half-served forever.

Before the check, ``redis://node`` served the keys of that node's slots and
retried every other key on ``MOVED`` until the pod was killed (2 of 6 jobs
completed). The TLS cluster's case is in test_redis_tls.py.
"""

from __future__ import annotations

from leaseworker_dev._services import LocalRedisCluster

from .cli import run_pod


def test_a_plain_redis_url_at_a_cluster_node_exits_2_naming_redis_cluster(
    redis_cluster: LocalRedisCluster,
) -> None:
    """The start-up probe reads keys of 16 slot ranges: one of them is another node's."""
    node = redis_cluster.nodes[0]
    ended = run_pod("--redis-url", f"redis://127.0.0.1:{node.port}/0", "--store-url", "memory://")
    assert "is a Redis Cluster node (it answered MOVED): use redis+cluster://" in ended.refusal()
