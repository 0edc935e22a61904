"""The seeded plan of a campaign: which fault, on what, when and for how long; which triggers.

Every random choice of a campaign is made here, from ``random.Random(seed)``,
before anything runs, so a seed names one plan (the timing of the real
processes still varies between runs). Durations scale with the job's lease:
a pause or a stall outlives it, a black-hole sometimes does and sometimes not.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

FaultKind = Literal[
    "redis_blackhole",
    "redis_delay",
    "redis_cut",
    "pod_pause",
    "pod_kill",
    "loop_stall",
    "redis_restart",
    "redis_restart_empty",
    "redis_clock_step",
    "kafka_restart",
    "broker_kill",
    "broker_rolling_restart",
    "sentinel_failover",
    "cluster_failover",
    "store_outage",
    "store_promote",
    "effects_refused",
    "outbox_claims_lapse",
    "receiver_restart",
    "pod_cut_redis",
    "pod_isolate",
]

PARTITION_FAULTS: Final[frozenset[FaultKind]] = frozenset({"pod_cut_redis", "pod_isolate"})
"""Faults that cut a pod's host apart from others (``--hosts``): from Redis, from everything."""

POD_FAULTS: Final[frozenset[FaultKind]] = PARTITION_FAULTS | frozenset[FaultKind](
    {"redis_blackhole", "redis_delay", "redis_cut", "pod_pause", "pod_kill", "loop_stall"}
)
"""Faults aimed at one pod; the others hit a shared service."""

PROXY_FAULTS: Final[frozenset[FaultKind]] = frozenset(
    {"redis_blackhole", "redis_delay", "redis_cut"}
)
"""Faults played on a pod's own Redis proxy (the single-node topology has them)."""

WEIGHTS: Final[dict[FaultKind, int]] = {
    "redis_blackhole": 4,
    "redis_delay": 3,
    "redis_cut": 3,
    "pod_pause": 2,
    "pod_kill": 2,
    "loop_stall": 2,
    "redis_restart": 1,
    "redis_restart_empty": 1,
    "redis_clock_step": 1,
    "kafka_restart": 1,
    "broker_kill": 2,
    "broker_rolling_restart": 1,
    "sentinel_failover": 2,
    "cluster_failover": 2,
    "store_outage": 1,
    "store_promote": 2,
    "effects_refused": 1,
    "outbox_claims_lapse": 1,
    "receiver_restart": 1,
    "pod_cut_redis": 3,
    "pod_isolate": 2,
}
"""How often each kind is drawn, relative to the others available."""

SHARDS: Final = 3
"""Shards of the local cluster (LocalRedisCluster: six nodes, three shards)."""

MEAN_GAP: Final = 1.0
"""Mean seconds between two fault starts (exponential): faults overlap in time."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedFault:
    """One fault: its kind, target pod (or ``None``), start offset and duration in seconds."""

    kind: FaultKind
    at: float
    duration: float
    target: str | None = None
    size: float = 0.0  # a reply delay's seconds; a failover's shard; a stall's 0 start, 1 end


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedTrigger:
    """One trigger: when to send it, for which key (index) and input version (counter)."""

    at: float
    key: int
    version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """A campaign's faults and triggers, in time order."""

    seed: int
    faults: tuple[PlannedFault, ...]
    triggers: tuple[PlannedTrigger, ...]

    @property
    def length(self) -> float:
        """Seconds from the start until the last fault has healed."""
        return max((f.at + f.duration for f in self.faults), default=0.0)


def make_plan(
    *,
    seed: int,
    faults: int,
    kinds: Sequence[FaultKind],
    pods: Sequence[str],
    keys: int,
    lease: float,
) -> Plan:
    """Draw ``faults`` faults of ``kinds`` over ``pods`` and a trigger stream over ``keys``."""
    rng = random.Random(seed)
    planned: list[PlannedFault] = []
    free_at: dict[str, float] = {}  # lane (a pod's name, or "shared") -> free again at
    at = 1.0
    for _ in range(faults):
        at += rng.expovariate(1 / MEAN_GAP)
        lanes = [*pods, "shared"]
        at = max(at, min(free_at.get(lane, 0.0) for lane in lanes))  # wait for a free lane
        free_pods = [pod for pod in pods if free_at.get(pod, 0.0) <= at]
        shared_free = free_at.get("shared", 0.0) <= at
        choices = [k for k in kinds if (bool(free_pods) if k in POD_FAULTS else shared_free)]
        kind = rng.choices(choices, weights=[WEIGHTS[k] for k in choices])[0]
        target = rng.choice(free_pods) if kind in POD_FAULTS else None
        fault = _sized(rng, kind, at, target, lease)
        free_at[target or "shared"] = fault.at + _occupies(fault, lease) + 0.5
        planned.append(fault)
    end = max((f.at + f.duration for f in planned), default=5.0)
    return Plan(seed=seed, faults=tuple(planned), triggers=_triggers(rng, keys, end))


def _occupies(fault: PlannedFault, lease: float) -> float:
    """Seconds a fault keeps its lane: its duration and what it waits for on top."""
    return (
        fault.duration
        + _EXTRA.get(fault.kind, 0.0)
        + (
            lease if fault.kind == "loop_stall" else 0.0  # the request waits for a job to take it
        )
    )


_EXTRA: Final[dict[FaultKind, float]] = {
    "kafka_restart": 15.0,  # the broker's start after its down time
    "broker_kill": 15.0,  # its start, and its replicas back in sync
    "broker_rolling_restart": 40.0,  # three stops, starts and catch-ups
    "sentinel_failover": 8.0,  # the promotion and the sentinels agreeing on it
    "cluster_failover": 8.0,
    "store_promote": 8.0,  # the promotion, then a fresh standby copied and streaming
}
"""Seconds beyond its duration a fault of this kind usually takes."""


_INSTANT_SIZES: Final[dict[FaultKind, Callable[[random.Random, float], float]]] = {
    "cluster_failover": lambda rng, lease: rng.randrange(SHARDS),  # the shard
    "redis_clock_step": lambda rng, lease: rng.uniform(1.1, 2.0) * lease,  # every lease expires
}
"""Instantaneous faults with a size: how each draws it (from the lease where it matters)."""


def _sized(
    rng: random.Random, kind: FaultKind, at: float, target: str | None, lease: float
) -> PlannedFault:
    """Give a fault its duration: relative to the lease where the lease decides the effect."""
    if kind == "redis_blackhole" or kind in PARTITION_FAULTS:
        duration = rng.uniform(0.2, 1.3) * lease  # long ones outlive the local deadline
    elif kind == "redis_delay":
        return PlannedFault(
            kind=kind,
            at=at,
            duration=rng.uniform(1.0, 5.0),
            target=target,
            size=rng.uniform(0.05, 0.6),
        )
    elif kind == "loop_stall":  # past the lease, at a job's start (0) or its end (1)
        duration = rng.uniform(1.1, 1.4) * lease
        return PlannedFault(
            kind=kind, at=at, duration=duration, target=target, size=rng.randrange(2)
        )
    elif kind == "pod_pause":
        duration = rng.uniform(1.1, 1.4) * lease  # past the lease: fencing's case
    elif kind == "store_outage":
        duration = rng.uniform(1.0, 8.0)
    elif kind in ("effects_refused", "outbox_claims_lapse"):
        duration = rng.uniform(1.0, 5.0)  # a lapse: a frozen broker, within the session timeout
    elif kind in _INSTANT_SIZES:
        return PlannedFault(kind=kind, at=at, duration=0.5, size=_INSTANT_SIZES[kind](rng, lease))
    elif kind in ("kafka_restart", "receiver_restart", "store_promote"):
        # Down time; then the broker's start, a new consumer on the same inbox,
        # or the store's standby promoted.
        duration = rng.uniform(0.5, 3.0)
    elif kind == "broker_kill":  # one of three brokers (size: its index), down 1 to 5 s
        return PlannedFault(kind=kind, at=at, duration=rng.uniform(1.0, 5.0), size=rng.randrange(3))
    else:  # a cut, a kill, a restart, a failover: instantaneous, then a short rest
        duration = 0.5
    return PlannedFault(kind=kind, at=at, duration=duration, target=target)


def _triggers(rng: random.Random, keys: int, end: float) -> tuple[PlannedTrigger, ...]:
    """Draw a trigger about every second until ``end``: duplicates and new versions."""
    versions = [0] * keys
    triggers = [PlannedTrigger(at=0.0, key=k, version=0) for k in range(keys)]
    at = 0.0
    while at < end:
        at += rng.uniform(0.3, 1.7)
        key = rng.randrange(keys)
        if rng.random() < 0.4:  # a new input version; else a duplicate of the current one
            versions[key] += 1
        triggers.append(PlannedTrigger(at=at, key=key, version=versions[key]))
    return tuple(triggers)


def fault_kinds(
    topology: Literal["single", "sentinel", "cluster"],
    *,
    store_outages: bool,
    own_store: bool = True,
    own_kafka: bool = True,
    kafka_brokers: int = 1,
    hosts: bool = False,
    postgres_standby: bool = False,
) -> list[FaultKind]:
    """Return the fault kinds a deployment can play (``own_*``: not given by a flag).

    ``kafka_brokers``: 3 for our three-broker cluster, whose brokers are
    killed or restarted in turn instead of the one broker's restart and freeze.
    ``hosts``: pods and services on hosts of their own, reached directly: the
    partitions instead of the pods' Redis proxies.
    ``postgres_standby``: the store is our primary and standby, whose primary
    is killed and standby promoted (no proxy in front: no store outage).
    """
    kinds: list[FaultKind] = ["pod_pause", "pod_kill", "loop_stall", "receiver_restart"]
    if own_kafka and kafka_brokers == 3:
        kinds += ["broker_kill", "broker_rolling_restart", "effects_refused"]
    elif own_kafka:  # the brokers of --bootstrap-servers are not ours to restart or freeze
        kinds += ["kafka_restart", "effects_refused"]
        if own_store:
            kinds.append("outbox_claims_lapse")
    if topology == "single":
        kinds += [*sorted(PROXY_FAULTS), "redis_restart", "redis_restart_empty", "redis_clock_step"]
    elif topology == "sentinel":
        kinds.append("sentinel_failover")
    else:
        kinds.append("cluster_failover")
    if store_outages:
        kinds.append("store_outage")
    if hosts:  # pods reach Redis directly: cut on the network, not by a proxy
        kinds = [k for k in kinds if k not in PROXY_FAULTS] + sorted(PARTITION_FAULTS)
    if postgres_standby:
        kinds.append("store_promote")
    return kinds
