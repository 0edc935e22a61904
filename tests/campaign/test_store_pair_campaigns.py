"""Short campaigns on a PostgreSQL primary and standby, each with its primary killed at least once.

Synchronous standby: ``leaseworker chaos --postgres-standby sync`` as a user
runs it, every invariant and Porcupine passing, no promotion losing anything.
Asynchronous standby: the campaign in this process, its standby made to lag
(the primary's WAL sender stopped before each kill, which waits until the
pods committed something the standby lacks), so each promotion loses it:
the loss is counted and its keys named, not hidden, and every invariant
holds on the other keys. The seed is the first whose plan of
:data:`FAULTS` faults promotes, so a change of weights keeps the test's premise.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from leaseworker.toolkit import load_job_class
from leaseworker_dev._campaign import Settings, render, run_campaign
from leaseworker_dev._campaign import _fault_play as fault_play
from leaseworker_dev._campaign._payloads import default_payloads
from leaseworker_dev._campaign._plan import fault_kinds, make_plan
from leaseworker_dev._campaign._promotion import compare, promote, read_state
from leaseworker_dev._services import LocalPostgresPair

from .cli import BENCH, CAMPAIGNS, chaos

JOB = "chaos_job:ShortLeaseReport"
FAULTS = 6
BUDGET = 240.0
"""Seconds one campaign may take; about 70 on an idle 2-core machine."""
LAG = 60.0
"""Seconds the pods have to commit what the stopped standby misses (before the kill)."""
PROMOTIONS = "nothing committed lost by a promotion to a synchronous standby"


def promoting_seed() -> int:
    """The first seed whose plan of :data:`FAULTS` faults promotes the standby."""
    kinds = fault_kinds("single", store_outages=False, postgres_standby=True)
    pods = ["pod-1", "pod-2", "pod-3"]
    for seed in range(1, 200):
        plan = make_plan(seed=seed, faults=FAULTS, kinds=kinds, pods=pods, keys=8, lease=6.0)
        if any(f.kind == "store_promote" for f in plan.faults):
            return seed
    raise AssertionError("no seed promotes")


@CAMPAIGNS
@pytest.mark.timeout(BUDGET + 30)
def test_a_synchronous_standby_campaign_loses_nothing(tmp_path: Path) -> None:
    """Exit 0, a promotion played, nothing lost, Porcupine linearizable."""
    report = tmp_path / "chaos.json"
    seed = promoting_seed()
    code, stdout, stderr = chaos(
        *(JOB, "--faults", str(FAULTS), "--seed", str(seed)),
        *("--postgres-standby", "sync", "--report", str(report)),
        budget=BUDGET,
    )
    assert code == 0, stdout + stderr
    document = json.loads(report.read_text())
    assert document["faults_by_kind"]["store_promote"] >= 1
    assert "--postgres-standby sync" in document["replay"]
    assert "synchronous standby" in document["store"]
    verdicts = {i["name"]: i for i in document["invariants"]}
    assert all(i["passed"] for i in verdicts.values())
    lost = verdicts[PROMOTIONS]["counts"]
    assert lost["synchronous"] == lost["promotions"] == document["faults_by_kind"]["store_promote"]
    outside = verdicts.get("outside checker (porcupine)")  # absent without Go: noted
    assert outside is None or outside["note"] == "linearizable"
    assert not any("lost by the asynchronous promotion" in note for note in document["notes"])


@CAMPAIGNS
@pytest.mark.timeout(BUDGET + 30)
def test_an_asynchronous_standby_campaign_counts_what_its_promotions_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Something lost, counted with its keys; every invariant passing; the note says it."""

    def lagging(pair: LocalPostgresPair, down_for: float) -> object:
        assert pair.standby is not None
        os.kill(pair.walsender_pid(), signal.SIGSTOP)  # killed with the primary's other children
        deadline = time.monotonic() + LAG
        while not compare(read_state(pair.primary), read_state(pair.standby)).keys:
            assert time.monotonic() < deadline, "the pods committed nothing in the lag"
            time.sleep(0.1)
        return promote(pair, down_for)

    monkeypatch.setattr(fault_play, "promote", lagging)
    monkeypatch.chdir(BENCH)  # the pods load the job from here
    monkeypatch.syspath_prepend(str(BENCH))
    settings = Settings(
        job=JOB,
        job_class=load_job_class(JOB),
        payloads=default_payloads,
        faults=FAULTS,
        seed=promoting_seed(),
        postgres_standby="async",
    )
    result = run_campaign(settings, out=lambda line: None)
    assert result.ok, render(result)
    verdicts = {v.name: v for v in result.verdicts}
    counts = verdicts[PROMOTIONS].counts
    assert counts["synchronous"] == 0
    assert counts["promotions"] == sum(
        1 for f in result.history.faults if f.kind == "store_promote"
    )
    kinds = ("completions", "claims", "outbox_rows", "sent_marks")
    assert sum(int(counts[f"async_lost_{what}"]) for what in kinds) > 0, render(result)
    assert int(counts["async_lost_keys"]) > 0
    [note] = [n for n in result.notes if n.startswith("lost by the asynchronous promotion")]
    assert "keys: report:" in note, note
    assert "lost by the asynchronous promotion" in render(result)
