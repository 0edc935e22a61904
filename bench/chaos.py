"""A thousand faults: ``leaseworker chaos`` campaigns across seeds and the three topologies.

Runs campaigns of ``--per-campaign`` faults on 4 pods (seeds ``--first-seed``,
+1, ...; topologies in turn ``single``, ``sentinel``, ``single``, ``cluster``;
the first ``single`` on three Kafka brokers (``--kafka-brokers 3``: one
killed, or all three restarted in turn, instead of the one broker's restart),
the second with ``--hosts``, pods cut from Redis or isolated, where
network namespaces can be made, else it says why and runs without; the
replicated ones with the store on a primary and synchronous standby, whose
primary ``store_promote`` kills) against ``bench/chaos_job.py:ShortLeaseReport``
(a 6 s lease) two campaigns in four, and ``CrunchReport`` (the same computing 1
to 5 s in a child process through ``run_in_process``, whose processes mark when
they ran) the other two, until ``--faults-total`` faults have been played
(about eight in ten planned faults play; the rest find their target busy or
idle), then prints the faults played by kind, the violations, the promotions
(to a synchronous standby, and what asynchronous ones lost), the worst stop
latency, the smallest margin before Redis could expire a key, the CPU-bound
executions' processes (how close to its execution's end each last ran) and
their children's CPU (committed, and
wasted by executions that did not commit, by outcome), the effects (each
completion publishes one message: committed, delivered, processed once,
duplicates dropped, lost, stale, claimed again; the receiver's consumers
replaced after an error), what the campaigns exercised,
Porcupine's verdict and the wall time. A fault starts every second on average
(a pod, or the shared services, has one at a time), so 1,000 faults take about
30 minutes with the campaigns' start-ups and drains.

    .venv/bin/python bench/chaos.py [--faults-total 1000] [--per-campaign 250]

Exit 1 if any campaign found a violation (its kept scratch directory is named
in its output).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from leaseworker_dev._campaign import RULES
from leaseworker_dev._services import Hosts

BENCH = Path(__file__).resolve().parent
LEASEWORKER = str(Path(sys.executable).parent / "leaseworker")
JOBS = ("chaos_job:ShortLeaseReport", "chaos_job:CrunchReport")
"""Two campaigns of the awaiting job, then two of the CPU-bound one (``run_in_process``), ..."""
TOPOLOGIES = ("single", "sentinel", "single", "cluster")
"""Half the campaigns on one node (it has the most fault kinds), a quarter on each replica set."""
PROMOTIONS = "nothing committed lost by a promotion to a synchronous standby"
CODE_AFTER_STOP = "no process of an execution ran after it stopped"
OUTSIDE = "outside checker (porcupine)"
BROKEN_LIMIT = 3
"""Campaigns that may break off (no report: a service did not come back) before the bench stops."""


def campaign(
    job: str, seed: int, faults: int, topology: str, report: Path, *flags: str
) -> dict[str, Any]:
    """Run one campaign (``flags`` added); return its JSON report (``ok`` False if unfinished)."""
    argv = [LEASEWORKER, "chaos", job, "--faults", str(faults), "--seed", str(seed), "--pods", "4"]
    argv += ["--topology", topology, "--report", str(report), *flags]
    print("$", " ".join(argv[1:]), flush=True)
    with subprocess.Popen(
        argv, cwd=BENCH, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        try:
            stdout, stderr = process.communicate()
        except KeyboardInterrupt:
            # subprocess.run would SIGKILL the campaign here, leaving its services running:
            # let it stop them (it takes Ctrl-C as a stop), then go.
            process.send_signal(signal.SIGINT)
            process.wait()
            raise
    print("\n".join(stdout.splitlines()[-10:]), flush=True)
    if not report.exists():
        print(stderr[-2000:], flush=True)
        return {"ok": False, "broke_off": True, "faults_by_kind": {}, "invariants": []}
    document: dict[str, Any] = json.loads(report.read_text())
    return document


def summary(reports: list[dict[str, Any]], wall: float) -> str:
    """Aggregate the campaigns' reports into the README's figures."""
    kinds: Counter[str] = Counter()
    for report in reports:
        kinds.update(report["faults_by_kind"])
    violations = sum(
        len(i["violations"]) or 1 for r in reports for i in r["invariants"] if not i["passed"]
    )
    losses = [i["counts"] for r in reports for i in r["invariants"] if "losses" in i["counts"]]
    counted = [c for c in losses if c["losses"]]
    worst = max((c["stop_latency_max_ms"] for c in counted), default=0.0)
    margin = min((c["min_margin_ms"] for c in counted), default=0.0)
    overlaps = [i["counts"] for r in reports for i in r["invariants"] if "overlaps" in i["counts"]]
    marked = [
        i["counts"]
        for r in reports
        for i in r["invariants"]
        if i["name"] == CODE_AFTER_STOP and i["counts"]["executions"]
    ]
    effects = _summed(reports)
    cpu = [r["child_cpu"] for r in reports if r.get("child_cpu")]
    wasted: Counter[str] = Counter()
    for one in cpu:
        wasted.update(one["wasted_by_outcome"])
    exercised = [r["exercised"] for r in reports if r.get("exercised")]
    through = ", ".join(f"{k[7:]} {n}" for k, n in effects.items() if k.startswith("across_"))
    lines = [
        f"campaigns          {len(reports)} ({sum(1 for r in reports if r['ok'])} passed, "
        f"{sum(1 for r in reports if r.get('inconclusive'))} inconclusive, "
        f"{sum(1 for r in reports if r.get('broke_off'))} broke off)",
        f"faults played      {sum(kinds.values())}",
        *(f"  {kind:<18} {count}" for kind, count in sorted(kinds.items())),
        f"violations         {violations}",
        f"promotions         {_promotions(reports)}",
        f"paused overlaps    {sum(c['paused_overlaps'] for c in overlaps)} (fenced)",
        f"data-loss overlaps {sum(c['data_loss_overlaps'] for c in overlaps)} (Redis restarted "
        "empty: the documented limit)",
        f"clock-step overlaps {sum(c.get('clock_step_overlaps', 0) for c in overlaps)} (Redis's "
        "clock stepped forward: each under a renewal interval + the Redis timeout)",
        f"losses             {sum(c['losses'] for c in losses)} "
        f"(+{sum(c['paused_losses'] for c in losses)} of paused executions)",
        f"worst stop latency {worst:.1f} ms",
        f"smallest margin    {margin:.1f} ms before Redis could expire the key",
        f"child processes    {sum(c['executions'] for c in marked)} executions marked by "
        f"{sum(c['processes'] for c in marked)} processes ({sum(c['marks'] for c in marked)} "
        f"marks); last mark at least {min((c['min_margin_ms'] for c in marked), default=0.0):.1f}"
        " ms before its execution's end",
        f"child CPU          {sum(c['committed_seconds'] for c in cpu):.1f} s committed, "
        f"{sum(c['wasted_seconds'] for c in cpu):.1f} s in "
        f"{sum(c['wasted_executions'] for c in cpu)} executions that did not commit ("
        + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(wasted.items()))
        + ")",
        f"effects            {effects['effects']} committed, {effects['delivered']} delivered, "
        f"{effects['processed']} processed (twice: {effects['processed_twice']}), "
        f"{effects['duplicates_dropped']} duplicates dropped, {effects['lost']} lost, "
        f"{effects['marked_before_acknowledged']} marked sent unacknowledged, "
        f"{effects['their_effects']} from stale executions, "
        f"{effects['claimed_again'] + effects['resent_unexplained']} sent ones claimed again"
        f" ({effects['resent_unexplained']} seen by their sends)",
        f"  in flight across {through}",
        f"  receiver         {effects['receiver_consumer_errors']} consumers replaced after"
        " an error",
        f"  relays           {effects['send_refusals']} send refusals, "
        f"{effects['claims_lapsed']} claims lapsed, "
        f"{effects['resent_later']} resent after the mark",
        f"exercised          {sum(e['executions'] for e in exercised)} executions, "
        f"{sum(e['completions'] for e in exercised)} completions, "
        f"{sum(e['hits'] for e in exercised)} of {sum(e['faults'] for e in exercised)} faults "
        "hit a running execution",
        f"outside checker    {_outside(reports)}",
        f"wall time          {wall / 60:.1f} min",
    ]
    return "\n".join(lines)


def _promotions(reports: list[dict[str, Any]]) -> str:
    """Count the store's promotions: how many to a synchronous standby, what the others lost."""
    counts = [i["counts"] for r in reports for i in r["invariants"] if i["name"] == PROMOTIONS]
    total: Counter[str] = Counter()
    for one in counts:
        total.update({k: v for k, v in one.items() if isinstance(v, int)})
    lost = ", ".join(
        f"{total[f'async_lost_{what}']} {what.replace('_', ' ')}"
        for what in ("completions", "claims", "outbox_rows", "sent_marks")
    )
    return (
        f"{total['promotions']} ({total['synchronous']} to a synchronous standby); "
        f"lost by the asynchronous ones: {lost}"
    )


def _outside(reports: list[dict[str, Any]]) -> str:
    """Porcupine's word on the campaigns: linearizable, or the keys it refused."""
    judged = [i for r in reports for i in r["invariants"] if i["name"] == OUTSIDE]
    refused = [v for i in judged for v in i["violations"]]
    explained = [i["note"] for i in judged if i["note"].startswith("NOT")]  # by a loss, named
    word = "; ".join([*refused, *explained][:3]) or "linearizable"  # "NOT linearizable (keys ...)"
    return f"(porcupine) {word} ({len(judged)} of {len(reports)} campaigns judged)"


def _summed(reports: list[dict[str, Any]]) -> Counter[str]:
    """Add up the effects invariants' integer counts over the campaigns."""
    total: Counter[str] = Counter()
    for report in reports:
        for invariant in report["invariants"][len(RULES) :]:  # the effects' follow the others
            if invariant["name"] == OUTSIDE:
                continue
            total.update({k: v for k, v in invariant["counts"].items() if isinstance(v, int)})
    for name in (
        "effects",
        "delivered",
        "processed",
        "processed_twice",
        "lost",
        "claimed_again",
        "resent_unexplained",
        "receiver_consumer_errors",
    ):
        total.setdefault(name, 0)
    return total


def main() -> int:
    """Run the campaigns and print the aggregate."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults-total", type=int, default=1000)
    parser.add_argument("--per-campaign", type=int, default=250)
    parser.add_argument("--first-seed", type=int, default=1)
    args = parser.parse_args()
    began = time.monotonic()
    if (no_hosts := Hosts.available()) is not None:
        print(f"no --hosts campaigns: {no_hosts}", flush=True)
    reports: list[dict[str, Any]] = []
    played = 0
    with tempfile.TemporaryDirectory(prefix="leaseworker-chaos-bench-") as scratch:
        while played < args.faults_total:
            index = len(reports)
            report = Path(scratch) / f"campaign-{index}.json"
            topology = TOPOLOGIES[index % len(TOPOLOGIES)]
            job = JOBS[index // 2 % len(JOBS)]
            seed = args.first_seed + index
            flags = ["--kafka-brokers", "3"] if index % len(TOPOLOGIES) == 0 else []
            if index % len(TOPOLOGIES) == 2 and no_hosts is None:
                flags.append("--hosts")
            if topology != "single":  # a replicated Redis; the store a synchronous pair
                flags += ["--postgres-standby", "sync"]
            reports.append(campaign(job, seed, args.per_campaign, topology, report, *flags))
            # Count what played: a fault whose target was busy the whole campaign is skipped;
            # a campaign that broke off reports nothing (its faults are not counted).
            broke_off = reports[-1].get("broke_off", False)
            played += sum(reports[-1]["faults_by_kind"].values()) or (
                0 if broke_off else args.per_campaign  # none played at all: never loop forever
            )
            if sum(1 for r in reports if r.get("broke_off")) >= BROKEN_LIMIT:
                break
    print(summary(reports, time.monotonic() - began))
    return 0 if all(r["ok"] for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
