"""``leaseworker chaos --hosts``: pods on hosts of their own, cut from Redis or from everything.

The plan on hosts swaps the pods' Redis proxy faults for the two partitions;
without namespaces (or with what they cannot serve) the flag is refused with
one line and exit 2; and a short campaign plays both kinds with every
invariant holding.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from leaseworker._cli import main
from leaseworker_dev._campaign._plan import (
    PARTITION_FAULTS,
    POD_FAULTS,
    PROXY_FAULTS,
    fault_kinds,
    make_plan,
)
from leaseworker_dev._services import Hosts

from .cli import CAMPAIGNS, chaos

BUDGET = 240.0
"""Seconds the short campaign may take (about 90 on an idle 2-core machine)."""


def test_on_hosts_the_partitions_replace_the_proxy_faults() -> None:
    """Both partition kinds aimed at a pod; no proxy kind, no store outage (no store proxy)."""
    kinds = fault_kinds("single", store_outages=False, hosts=True)
    assert set(kinds) >= PARTITION_FAULTS
    assert not PROXY_FAULTS & set(kinds)
    assert PARTITION_FAULTS <= POD_FAULTS
    assert not PARTITION_FAULTS & set(fault_kinds("single", store_outages=True))
    pods = ["pod-1", "pod-2", "pod-3"]
    plan = make_plan(seed=2, faults=6, kinds=kinds, pods=pods, keys=8, lease=6.0)  # the campaign's
    cuts = [f for f in plan.faults if f.kind in PARTITION_FAULTS]
    assert {f.kind for f in cuts} == PARTITION_FAULTS
    assert all(f.target is not None and 0.2 * 6.0 <= f.duration <= 1.3 * 6.0 for f in cuts)


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["--topology", "sentinel"], "--hosts: the single topology only"),
        (["--store-url", "sqlite:///x.db"], "--hosts: its own services only"),
        ([], "--hosts: network namespaces need root"),
    ],
)
def test_hosts_it_cannot_make_or_serve_exit_2(
    argv: list[str],
    reason: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One line on stderr, nothing started: as on a machine where namespaces cannot be made."""
    monkeypatch.setattr(Hosts, "available", lambda: "network namespaces need root (ip netns add)")
    assert main(["chaos", "tests.jobs:MarkerJob", "--hosts", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"leaseworker chaos: error: {reason}"), err


@CAMPAIGNS
@pytest.mark.timeout(BUDGET + 60)
def test_a_short_campaign_on_hosts_plays_both_partitions_and_passes(tmp_path: Path) -> None:
    """Seed 2, 6 faults on 3 pods: a pod cut from Redis and one isolated; every invariant PASS."""
    reason = Hosts.available()
    if reason is not None:
        pytest.skip(reason)
    report = tmp_path / "chaos.json"
    code, stdout, stderr = chaos(
        *("chaos_job:ShortLeaseReport", "--hosts", "--faults", "6", "--seed", "2"),
        *("--pods", "3", "--report", str(report)),
        budget=BUDGET,
    )
    assert code == 0, stdout + stderr
    document = json.loads(report.read_text())
    assert document["replay"].endswith("--hosts")
    played = Counter(document["faults_by_kind"])
    assert played["pod_cut_redis"] >= 1, played
    assert played["pod_isolate"] >= 1, played
    assert all(invariant["passed"] for invariant in document["invariants"])
    windows = [f for f in document["faults"] if f["kind"] in PARTITION_FAULTS]
    assert all(f["target"] and f["end"] > f["start"] for f in windows), windows
