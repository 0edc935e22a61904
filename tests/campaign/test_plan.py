"""The seeded plan: one seed, one plan; one fault per pod or service at a time; kinds allowed."""

from __future__ import annotations

import random

import pytest

from leaseworker import ConfigError
from leaseworker_dev._campaign import load_generator
from leaseworker_dev._campaign._payloads import default_payloads
from leaseworker_dev._campaign._plan import POD_FAULTS, Plan, fault_kinds, make_plan
from leaseworker_dev._campaign._testbed import Topology

PODS = ["pod-1", "pod-2", "pod-3"]


def _plan(seed: int, topology: Topology = "single") -> Plan:
    kinds = fault_kinds(topology, store_outages=True)
    return make_plan(seed=seed, faults=60, kinds=kinds, pods=PODS, keys=8, lease=30.0)


def test_a_seed_names_one_plan() -> None:
    """The same seed draws the same faults and triggers; another seed draws others."""
    assert _plan(7) == _plan(7)
    assert _plan(7) != _plan(8)


@pytest.mark.parametrize("topology", ["single", "sentinel", "cluster"])
def test_faults_never_share_a_lane_and_fit_the_topology(topology: Topology) -> None:
    """A pod (or the shared services) has one fault at a time; only the topology's kinds."""
    plan = _plan(3, topology)
    allowed = set(fault_kinds(topology, store_outages=True))
    busy: dict[str, float] = {}
    for fault in plan.faults:
        assert fault.kind in allowed
        lane = fault.target or "shared"
        assert (fault.target is not None) == (fault.kind in POD_FAULTS)
        assert fault.at >= busy.get(lane, 0.0)
        busy[lane] = fault.at + fault.duration
    assert len(plan.faults) == 60


def test_the_sentinel_topology_has_failovers_and_no_proxy_faults() -> None:
    """Without per-pod proxies there are no black-holes; a Sentinel group can fail over."""
    kinds = fault_kinds("sentinel", store_outages=False)
    assert "sentinel_failover" in kinds
    assert not {"redis_blackhole", "redis_delay", "redis_cut", "store_outage"} & set(kinds)


def test_three_brokers_are_killed_or_restarted_in_turn_never_frozen() -> None:
    """On our three brokers: a broker killed, a rolling restart; not the one broker's faults."""
    kinds = fault_kinds("single", store_outages=True, kafka_brokers=3)
    assert {"broker_kill", "broker_rolling_restart", "effects_refused"} <= set(kinds)
    assert not {"kafka_restart", "outbox_claims_lapse"} & set(kinds)
    assert not {"broker_kill", "broker_rolling_restart"} & set(
        fault_kinds("single", store_outages=True)
    )
    plan = make_plan(seed=5, faults=60, kinds=kinds, pods=PODS, keys=8, lease=30.0)
    killed = [f for f in plan.faults if f.kind == "broker_kill"]
    assert killed
    assert {f.size for f in killed} <= {0, 1, 2}


def test_a_store_pair_has_its_primary_killed_and_no_proxy_outage() -> None:
    """On our primary and standby: promotions, with a down time; no outage of a proxy."""
    kinds = fault_kinds("single", store_outages=False, postgres_standby=True)
    assert "store_promote" in kinds
    assert "store_outage" not in kinds
    assert "store_promote" not in fault_kinds("single", store_outages=True)
    plan = make_plan(seed=5, faults=60, kinds=kinds, pods=PODS, keys=8, lease=30.0)
    promotions = [f for f in plan.faults if f.kind == "store_promote"]
    assert promotions
    assert all(f.target is None and 0.5 <= f.duration <= 3.0 for f in promotions)


def test_only_the_single_node_steps_its_clock_past_every_lease() -> None:
    """The one node runs on a stepped clock; a replicated topology's nodes do not."""
    assert "redis_clock_step" not in fault_kinds("sentinel", store_outages=True)
    assert "redis_clock_step" not in fault_kinds("cluster", store_outages=True)
    steps = [f for f in _plan(3).faults if f.kind == "redis_clock_step"]
    assert steps
    assert all(33.0 <= f.size <= 60.0 for f in steps)  # 1.1 to 2 leases of 30 s


def test_the_default_payloads_name_the_same_key_by_record_and_by_tenant() -> None:
    """Record key and payload agree, so jobs keyed either way see one job key."""
    key, payload = default_payloads(random.Random(1), 3, 2)
    assert key == f"report:{payload['tenant']}:{payload['period']}" == "report:tenant-3:2026-11"
    assert payload["inputVersion"] == "v2"


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("nocolon", "pkg.module:function"),
        ("no_such_module:f", "cannot import"),
        ("random:nothing_here", "is not a function"),
    ],
)
def test_a_bad_payload_generator_is_a_config_error(spec: str, reason: str) -> None:
    """The command exits 2 with this one-line reason."""
    with pytest.raises(ConfigError, match=reason):
        load_generator(spec)
