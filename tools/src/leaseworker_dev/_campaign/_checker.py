"""The checker: judge a recorded history and the campaign's records against the invariants.

Each invariant is one function returning a :class:`Verdict` (PASS/FAIL, its
counts, the first violations in words). The history is what the pods' recorders
wrote (see :mod:`leaseworker._worker._recorder`), with the campaign's faults;
the :class:`~._records.Records` are independent witnesses: the triggers sent,
offsets committed, dead letters, stored completions and pod exits. A checker
that cannot fail is a defect: tests/campaign feed it crafted histories with
each violation.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Iterable

from leaseworker.toolkit import Execution, History, Scalar

from ._campaign_records import Records
from ._effect_checks import EFFECT_RULES
from ._invariant_verdict import MAX_SHOWN, Verdict, verdict
from ._promotion import KIND as PROMOTION
from ._promotion import explained_keys

DATA_LOSS_FAULTS = frozenset({"redis_restart_empty"})
"""Faults after which Redis forgot held leases: the documented limit, fencing's job."""

CLOCK_STEP = "redis_clock_step"
"""A forward step of Redis's wall clock: leases expire early, their holders run on.

The holder stops at its next renewal, rejected: an overlap that began after
the step and ended within the window's ``overlap_bound_s`` of its start (the
renewal interval plus the Redis timeout, and a margin) is the documented
limit, counted apart; a longer one is a violation.
"""

DEATH_GRACE = 1.0
"""Seconds an execution's processes may outlive its SIGKILLed pod (the keeper's bound)."""


def check(history: History, records: Records) -> list[Verdict]:
    """Run every invariant over ``history`` and ``records``, the effects' last."""
    return [rule(history, records) for rule in (*RULES, *EFFECT_RULES)]


def no_overlap(history: History, records: Records) -> Verdict:
    """No two executions of one job key held the lease at once.

    An overlap involving a *paused* execution (its pod frozen or its loop
    stalled) is counted apart: the lease cannot stop a frozen process, fencing
    does. So is one across a fault that emptied Redis (the documented limit),
    and one a forward step of Redis's clock allowed, within its bound.
    """
    until = history.end
    violations: list[str] = []
    paused = data_loss = clock_step = 0
    for first, second in history.overlapping(until=until):
        if first.paused or second.paused:
            paused += 1
        elif _across_data_loss(first, second, history):
            data_loss += 1
        elif _within_clock_step(first, second, history):
            clock_step += 1
        else:
            seconds = first.overlaps(second, until=until)
            violations.append(
                f"{first.job_key}: {first.execution_id} ({first.pod}, fence {first.fence}) and "
                f"{second.execution_id} ({second.pod}, fence {second.fence}) overlapped "
                f"{seconds * 1000:.0f} ms"
            )
    counts: dict[str, Scalar] = {
        "executions": len(history.executions),
        "keys": len(history.keys()),
        "overlaps": len(violations),
        "paused_overlaps": paused,
        "data_loss_overlaps": data_loss,
        "clock_step_overlaps": clock_step,
    }
    return verdict("no two executions of one key at once", counts, violations)


def fences_increase(history: History, records: Records) -> Verdict:
    """Per key, fences strictly increase in acquisition order."""
    violations: list[str] = []
    for key, executions in _by_key(history).items():
        fenced = [(e.fence, e) for e in executions if e.fence is not None]
        for (fence, earlier), (next_fence, later) in itertools.pairwise(fenced):
            if next_fence <= fence:
                violations.append(
                    f"{key}: {later.execution_id} acquired fence {next_fence} after "
                    f"{earlier.execution_id} had fence {fence}"
                )
    counts: dict[str, Scalar] = {"acquisitions": len(history.executions)}
    counts["inversions"] = len(violations)
    return verdict("fences strictly increase per key", counts, violations)


def one_completion(history: History, records: Records) -> Verdict:
    """Exactly one accepted completion per completed identity, by its highest fence; none stale.

    An identity's accepted execution must have the highest fence of those the
    store answered ``accepted`` or ``stale`` for it, and must be what the
    store holds; an accepted write whose fence is below one that another
    execution of the key had already shown the store (a completion attempt
    begun earlier) is a stale write accepted. On a key whose store state an
    asynchronous promotion lost, these are what the loss let through, counted
    (``recomputed_after_loss``, ``lower_fence_after_loss``), not violations.
    """
    explained = explained_keys(history)
    violations: list[str] = []
    recomputed: set[tuple[str, str]] = set()
    lower = stale_accepted = 0
    by_identity: dict[tuple[str, str], list[Execution]] = defaultdict(list)
    for execution in history.executions:
        if execution.input_version is not None and execution.completion is not None:
            by_identity[(execution.job_key, execution.input_version)].append(execution)
    for identity, attempts in by_identity.items():
        for what, described in _identity_faults(identity, attempts, records):
            if identity[0] not in explained:
                violations.append(described)
            elif what == "lower" and identity not in recomputed:  # not its own recomputation
                lower += 1
            else:
                recomputed.add(identity)
    for key, stale in _stale_writes_accepted(history):
        if key in explained:
            lower += 1
            continue
        stale_accepted += 1
        violations.append(stale)
    counts: dict[str, Scalar] = {
        "identities": len(by_identity),
        "accepted": sum(1 for e in history.executions if e.completion == "accepted"),
        "stale_refused": sum(1 for e in history.executions if e.completion == "stale"),
        "duplicates": sum(1 for e in history.executions if e.completion == "duplicate"),
        "stale_accepted": stale_accepted,
    }
    if explained:
        counts |= {"recomputed_after_loss": len(recomputed), "lower_fence_after_loss": lower}
    return verdict("one completion per identity, highest fence, none stale", counts, violations)


def _identity_faults(
    identity: tuple[str, str], attempts: list[Execution], records: Records
) -> Iterable[tuple[str, str]]:
    """Describe what is wrong with one identity's completions: ``twice``, ``lower``, ``stored``."""
    accepted = [e for e in attempts if e.completion == "accepted"]
    if len(accepted) > 1:
        yield "twice", f"{_name(identity)}: {len(accepted)} completions accepted"
    contenders = [e for e in attempts if e.completion in ("accepted", "stale")]
    highest = max((e.fence or 0 for e in contenders), default=0)
    stored = records.completions.get(identity)
    for winner in accepted:
        if (winner.fence or 0) < highest:
            yield (
                "lower",
                (
                    f"{_name(identity)}: accepted fence {winner.fence}, but fence {highest} "
                    "attempted it and was refused"
                ),
            )
        if stored is not None and stored.execution_id != winner.execution_id:
            yield (
                "stored",
                (
                    f"{_name(identity)}: the store holds {stored.execution_id}, the history "
                    f"says {winner.execution_id} was accepted"
                ),
            )


def nothing_lost(history: History, records: Records) -> Verdict:
    """Every produced trigger's offset committed; every identity completed or dead-lettered.

    An identity of a key whose store state an asynchronous promotion lost,
    left without its completion, is counted (``lost_by_promotion``), not a violation.
    """
    explained = explained_keys(history)
    violations: list[str] = []
    uncommitted = [p for p in records.produced if records.committed.get(p.partition, 0) <= p.offset]
    for trigger in uncommitted[:MAX_SHOWN]:
        violations.append(f"offset {trigger.partition}@{trigger.offset} never committed")
    dead = {(d.partition, d.offset): d for d in records.dead_letters}
    identities: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for trigger in records.produced:
        identities[(trigger.job_key, trigger.input_version)].append(
            (trigger.partition, trigger.offset)
        )
    unfinished = 0
    dead_lettered = 0
    lost = 0
    for identity, positions in identities.items():
        if identity in records.completions:
            continue
        if identity[0] in explained:
            lost += 1
            continue
        letters = [dead[p] for p in positions if p in dead]
        if letters and all(letter.reason for letter in letters):
            dead_lettered += 1
            continue
        unfinished += 1
        violations.append(f"{_name(identity)}: neither completed nor dead-lettered with a reason")
    counts: dict[str, Scalar] = {
        "triggers": len(records.produced),
        "identities": len(identities),
        "completed": len(identities) - unfinished - dead_lettered - lost,
        "dead_lettered": dead_lettered,
        "uncommitted": len(uncommitted),
        "unfinished": unfinished,
    }
    if explained:
        counts["lost_by_promotion"] = lost
    return verdict("every trigger committed, every identity done", counts, violations)


def pods_exited_cleanly(history: History, records: Records) -> Verdict:
    """No pod exited non-zero (or at all, before the end) except those the campaign killed."""
    violations = [
        f"pod {e.pod} exited with {e.code}" for e in records.exits if not e.killed and e.code != 0
    ]
    counts: dict[str, Scalar] = {
        "exits": len(records.exits),
        "killed": sum(1 for e in records.exits if e.killed),
        "unexpected": len(violations),
    }
    return verdict("no pod exited non-zero unless killed", counts, violations)


def losses_stopped_in_time(history: History, records: Records) -> Verdict:
    """Per loss: how long the body took to stop, and the margin left before Redis expiry.

    A loss whose body stopped after Redis could have expired the key (a
    negative margin) fails. Losses of paused executions are only counted:
    a frozen process cannot stop in time, fencing protects the store.
    """
    latencies: list[float] = []
    margins: list[float] = []
    violations: list[str] = []
    paused = 0
    for execution in history.executions:
        for step in execution.steps:
            if step.name != "stopped":
                continue
            if execution.paused:  # frozen past its lease: it could not stop; fencing did
                paused += 1
                continue
            latencies.append(float(step.attrs.get("latency_ms", 0.0)))
            if "margin_ms" not in step.attrs:
                continue
            margin = float(step.attrs["margin_ms"])
            margins.append(margin)
            if margin < 0:
                violations.append(
                    f"{execution.job_key}: {execution.execution_id} ({execution.pod}) stopped "
                    f"{-margin:.0f} ms after Redis could expire its lease"
                )
    counts: dict[str, Scalar] = {
        "losses": len(latencies),
        "paused_losses": paused,
        "stop_latency_max_ms": max(latencies, default=0.0),
        "stop_latency_p99_ms": _percentile(latencies, 0.99),
        "min_margin_ms": min(margins, default=0.0),
        "late_stops": len(violations),
    }
    return verdict("every loss stopped before Redis could expire the key", counts, violations)


def no_code_after_stop(history: History, records: Records) -> Verdict:
    """No process of an execution (its child, the child's children) ran code after it stopped.

    Judged from the marks its processes left on the monotonic clock (the job
    writes them: ``records.marks``), against the execution's recorded end
    (its body's stop after a loss, else its release) and against the start
    of the key's next execution. An
    execution ended by its pod's SIGKILL ends when the campaign reaped the
    pod; its processes get :data:`DEATH_GRACE` more. A paused pod is no
    excuse: its child must kill itself at its deadline. Only the start of a
    next execution across a fault that emptied Redis is the documented limit.
    """
    executions = {e.execution_id: e for e in history.executions}
    following = _next_of_key(history)
    violations: list[str] = []
    margins: list[float] = []
    judged: set[str] = set()
    for mark in records.marks:
        execution = executions.get(mark.execution_id)
        if execution is None or execution.end is None:
            continue
        judged.add(mark.execution_id)
        grace = DEATH_GRACE if execution.outcome == "killed" else 0.0
        margins.append(execution.end + grace - mark.last)
        if mark.last > execution.end + grace:
            violations.append(
                f"{execution.job_key}: {execution.execution_id} ({execution.pod}): process "
                f"{mark.pid} ran {(mark.last - execution.end) * 1000:.0f} ms after the "
                f"execution ended ({execution.outcome or 'no outcome'})"
            )
        later = following.get(execution.execution_id)
        if (
            later is not None
            and mark.last >= later.start
            and not _across_data_loss(execution, later, history)
            and not _within_clock_step(execution, later, history, until=mark.last)
        ):
            violations.append(
                f"{execution.job_key}: {execution.execution_id} ({execution.pod}): process "
                f"{mark.pid} ran {(mark.last - later.start) * 1000:.0f} ms into "
                f"{later.execution_id} ({later.pod}, fence {later.fence})"
            )
    counts: dict[str, Scalar] = {
        "executions": len(judged),
        "processes": sum(1 for m in records.marks if m.execution_id in judged),
        "marks": sum(m.count for m in records.marks if m.execution_id in judged),
        "min_margin_ms": round(min(margins, default=0.0) * 1000, 1),
        "late": len(violations),
    }
    return verdict("no process of an execution ran after it stopped", counts, violations)


LOSSES = ("completions", "claims", "outbox_rows", "sent_marks")
"""What a promotion can lose, counted in its fault window (``_promotion``)."""


def promotions_lost_nothing(history: History, records: Records) -> Verdict:
    """Check a promotion to a synchronous standby lost nothing the primary had committed.

    What an asynchronous one lost is counted (``async_lost_*``, the keys in
    ``async_lost_keys``), not a violation: the checks above count what it let
    through on those keys, and any other key is judged as always.
    """
    name = "nothing committed lost by a promotion to a synchronous standby"
    played = [f for f in history.faults if f.kind == PROMOTION]
    if not played:
        return Verdict(name=name, passed=True, note="no promotion")
    violations = []
    sums = dict.fromkeys(LOSSES, 0)
    for fault in played:
        lost = {what: int(fault.attrs.get(f"lost_{what}", 0) or 0) for what in LOSSES}
        if fault.attrs.get("synchronous") is False:
            sums = {what: sums[what] + n for what, n in lost.items()}
        elif any(lost.values()):
            shown = ", ".join(f"{n} {what.replace('_', ' ')}" for what, n in lost.items() if n)
            violations.append(
                f"the promotion at {fault.start:.3f} lost {shown} "
                f"(keys {fault.attrs.get('lost_keys', '')})"
            )
    synchronous = sum(1 for f in played if f.attrs.get("synchronous") is not False)
    counts: dict[str, Scalar] = {
        "promotions": len(played),
        "synchronous": synchronous,
        **{f"async_lost_{what}": n for what, n in sums.items()},
        "async_lost_keys": len(explained_keys(history)),
    }
    return verdict(name, counts, violations)


RULES: tuple[Callable[[History, Records], Verdict], ...] = (
    no_overlap,
    fences_increase,
    one_completion,
    nothing_lost,
    pods_exited_cleanly,
    losses_stopped_in_time,
    no_code_after_stop,
    promotions_lost_nothing,
)
"""Every invariant, in report order."""


def _by_key(history: History) -> dict[str, list[Execution]]:
    """Group the executions by key, each in acquisition order (their start)."""
    keys: dict[str, list[Execution]] = defaultdict(list)
    for execution in sorted(history.executions, key=lambda e: e.start):
        keys[execution.job_key].append(execution)
    return keys


def _next_of_key(history: History) -> dict[str, Execution]:
    """Map each execution id to the key's next execution (by start), where there is one."""
    return {
        earlier.execution_id: later
        for executions in _by_key(history).values()
        for earlier, later in itertools.pairwise(executions)
    }


def _across_data_loss(first: Execution, second: Execution, history: History) -> bool:
    """Whether Redis lost its data while ``first`` held the lease, before ``second`` began."""
    return any(
        fault.kind in DATA_LOSS_FAULTS and first.start <= fault.start <= second.start
        for fault in history.faults
    )


def _within_clock_step(
    first: Execution, second: Execution, history: History, *, until: float | None = None
) -> bool:
    """Whether a clock step while ``first`` held the lease explains the overlap.

    The step came before ``second`` began, and ``first`` (or, with ``until``,
    what of it still ran then) ended within the step's bound.
    """
    end = until if until is not None else first.end
    if end is None:
        return False
    return any(
        fault.kind == CLOCK_STEP
        and first.start <= fault.start <= second.start
        and end <= fault.start + float(fault.attrs.get("overlap_bound_s", 0.0) or 0.0)
        for fault in history.faults
    )


def _stale_writes_accepted(history: History) -> Iterable[tuple[str, str]]:
    """Describe accepted completions below a fence another execution had shown the store."""
    for key, executions in _by_key(history).items():
        attempts = [
            (step.at, execution)
            for execution in executions
            for step in execution.steps
            if step.name == "completion"
        ]
        for at, winner in attempts:
            if winner.completion != "accepted" or winner.fence is None:
                continue
            for earlier_at, other in attempts:
                if earlier_at + _duration(other) < at and (other.fence or 0) > winner.fence:
                    yield (
                        key,
                        f"{key}: {winner.execution_id} (fence {winner.fence}) accepted after "
                        f"{other.execution_id} had shown fence {other.fence}",
                    )
                    break


def _duration(execution: Execution) -> float:
    return max((s.duration for s in execution.steps if s.name == "completion"), default=0.0)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def _name(identity: tuple[str, str]) -> str:
    return f"{identity[0]} version {identity[1]}"
