"""What one node of a local Sentinel group reports: its role, its replication link, TILT."""

from __future__ import annotations

from typing import Literal

import redis

from ._nodes import RedisNode

Role = Literal["master", "replica", "sentinel", "paused", "down"]
"""A node's role as :meth:`LocalSentinelGroup.roles` observes it."""


def follows(replica: RedisNode, master: RedisNode) -> bool:
    """Whether ``replica`` replicates from ``master`` with its link up."""
    role = replica.role()
    return role[0] == "slave" and (role[2], role[3]) == (master.port, "connected")


def in_tilt(sentinel: RedisNode) -> bool:
    """Whether ``sentinel`` is in TILT (its timer ran late; it acts again 30 s after)."""
    return sentinel.info("sentinel")["sentinel_tilt"] == "1"


def role_of(node: RedisNode) -> Role:
    """Return ``node``'s role as a probe sees it (down and paused included)."""
    if not node.alive:
        return "down"
    if node.paused:
        return "paused"
    try:
        reported = node.role()[0]
    except redis.RedisError:
        return "down"
    if reported == "master":
        return "master"
    return "replica" if reported == "slave" else "sentinel"
