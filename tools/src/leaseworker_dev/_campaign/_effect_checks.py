"""The effects' invariants: every committed message delivered, processed once, none stale.

Judged over the effects' witnesses in :class:`~._records.Records`: the outbox
rows read from the store's table after the run, every record the campaign's
receiver consumed (with the producer's timestamp), the receiver's own effect
rows and the store's audit of claims on messages already sent. Two of them
catch Spring Modulith's failure modes: a message marked sent before the
broker had it (spring-modulith #395: the send failed, the publication was
marked completed) and a claim on a message already sent (#1935: completed
publications resubmitted). Tests plant each violation (tests/campaign).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable

from leaseworker.toolkit import History, Scalar

from ._campaign_records import Delivery, Outboxed, Records
from ._invariant_verdict import Verdict, verdict
from ._promotion import explained_keys, lost_effects

ACROSS = (
    "pod_kill",
    "pod_pause",
    "kafka_restart",
    "broker_kill",
    "broker_rolling_restart",
    "store_outage",
    "store_promote",
    "effects_refused",
    "outbox_claims_lapse",
    "receiver_restart",
    "pod_isolate",
)
"""Fault kinds counted when they struck while an effect was between its commit and delivery."""

CLOCK_SLACK = 0.002
"""Seconds between a record's millisecond timestamp and the store's clock that prove nothing."""

NO_EFFECTS = "no effects"


def effects_delivered(history: History, records: Records) -> Verdict:
    """Every committed message sent and on its topic; none marked sent before the broker had it.

    A row marked sent whose first record was created after the mark (or that
    has no record at all) was marked without the broker's acknowledgement.
    """
    name = "every accepted completion's effects delivered, none lost"
    if not records.outbox:
        return Verdict(name=name, passed=True, note=NO_EFFECTS)
    delivered = _deliveries(records)
    violations: list[str] = []
    lost = unsent = premature = 0
    for row in records.outbox:
        got = delivered.get(row.effect_id, [])
        first = min((d.created for d in got), default=None)
        if row.sent is None:
            unsent += 1
            violations.append(f"{_named(row)}: committed, never marked sent")
        if first is None:
            lost += 1
            said = " although marked sent" if row.sent is not None else ""
            violations.append(f"{_named(row)}: committed, never delivered{said}")
        elif row.sent is not None and first > row.sent + CLOCK_SLACK:
            premature += 1
            violations.append(
                f"{_named(row)}: marked sent {first - row.sent:.3f}s before the broker had it"
            )
    counts: dict[str, Scalar] = {
        "effects": len(records.outbox),
        "completions": len(records.completions),
        "completions_with_effects": len({(r.job_key, r.input_version) for r in records.outbox}),
        "delivered": len(records.outbox) - lost,
        "unsent": unsent,
        "lost": lost,
        "marked_before_acknowledged": premature,
        **{f"across_{kind}": n for kind, n in _across(history, records, delivered).items()},
    }
    return verdict(name, counts, violations)


def effects_processed_once(history: History, records: Records) -> Verdict:
    """Check the receiver processed each committed effect exactly once, and nothing else.

    Its inbox drops redeliveries (``duplicate``) and effects below a fence it
    has seen for their job key (``stale``); what it let through are its own
    effect rows, counted here without trusting its answers. An effect
    processed whose row an asynchronous promotion lost is counted
    (``row_lost_by_promotion``), not a violation; so are the receiver's
    consumers an error ended (``receiver_consumer_errors``: the next one reads
    on from the committed offsets, its inbox dropping what it redelivers).
    """
    name = "each effect processed once by the receiver"
    if not records.outbox and not records.deliveries:
        return Verdict(name=name, passed=True, note=NO_EFFECTS)
    committed = {row.effect_id: row for row in records.outbox}
    delivered = _deliveries(records)
    violations: list[str] = []
    twice = unprocessed = phantom = 0
    for effect_id, row in committed.items():
        times = records.processed.get(effect_id, 0)
        if times > 1:
            twice += 1
            violations.append(f"{_named(row)}: processed {times} times")
        elif times == 0 and effect_id in delivered:
            unprocessed += 1
            answers = ", ".join(sorted({d.status for d in delivered[effect_id]}))
            violations.append(f"{_named(row)}: delivered, never processed ({answers})")
    lost = lost_effects(history)
    explained = 0
    for effect_id, times in records.processed.items():
        if effect_id not in committed and effect_id in lost:
            explained += 1
        elif effect_id not in committed:
            phantom += 1
            violations.append(f"effect {effect_id}: processed {times}x, never committed")
    statuses = Counter(d.status for d in records.deliveries)
    counts: dict[str, Scalar] = {
        "deliveries": len(records.deliveries),
        "processed": sum(records.processed.values()),
        "duplicates_dropped": statuses["duplicate"],
        "stale_dropped": statuses["stale"],
        "without_effect_headers": sum(1 for d in records.deliveries if d.effect_id is None),
        "processed_twice": twice,
        "never_processed": unprocessed,
        "never_committed": phantom,
        "receiver_consumer_errors": len(records.receiver_errors),
    }
    if lost:
        counts["row_lost_by_promotion"] = explained
    return verdict(name, counts, violations)


def no_stale_effects(history: History, records: Records) -> Verdict:
    """No effect of an execution the store did not accept was committed or delivered.

    Each outbox row must carry the fence of its identity's accepted
    completion (a stale or superseded execution has another fence, and its
    transaction must have written nothing), and each record the fence of its row.
    A record of an earlier fence on a key whose store state an asynchronous
    promotion lost (its row lost, its identity recomputed) is counted
    (``delivered_before_loss``), not a violation.
    """
    name = "no effect from a stale or superseded execution"
    refused = [e for e in history.executions if e.completion == "stale" or e.reason == "stale"]
    if not records.outbox and not records.deliveries:
        return Verdict(name=name, passed=True, note=NO_EFFECTS)
    refused_fences = {(e.job_key, e.fence) for e in refused}
    committed = {row.effect_id: row for row in records.outbox}
    violations: list[str] = []
    for row in records.outbox:
        stored = records.completions.get((row.job_key, row.input_version))
        if (row.job_key, row.fence) in refused_fences:
            violations.append(f"{_named(row)}: committed by fence {row.fence}, refused as stale")
        elif stored is None:
            violations.append(f"{_named(row)}: committed without its completion")
        elif stored.fence != row.fence:
            violations.append(
                f"{_named(row)}: committed by fence {row.fence}, the accepted completion's "
                f"is {stored.fence}"
            )
    explained, before_loss = explained_keys(history), 0
    for delivery in records.deliveries:
        sent = committed.get(delivery.effect_id or "")
        if sent is not None and delivery.fence != sent.fence and sent.job_key in explained:
            before_loss += 1
        elif sent is not None and delivery.fence != sent.fence:
            violations.append(
                f"{_named(sent)}: delivered with fence {delivery.fence}, committed at {sent.fence}"
            )
    counts: dict[str, Scalar] = {
        "stale_executions": len(refused),
        "their_effects": sum(1 for r in records.outbox if (r.job_key, r.fence) in refused_fences),
        "effects_off_the_accepted_fence": len(violations),
    }
    if explained:
        counts["delivered_before_loss"] = before_loss
    return verdict(name, counts, violations)


def no_sent_message_claimed_again(history: History, records: Records) -> Verdict:
    """No relay claimed a message already marked sent: seen in the store, or by the sends.

    Two witnesses. The store's audit (``reclaims``) sees a claim that wrote a
    sent row's claim columns. A claim that writes nothing (PostgreSQL's row
    locks) is seen by what it does: it sends. A relay sends only what it
    claimed, and a record created after its message was marked sent
    (``resent_later``) can come from a claim taken before the mark only if
    that claim lapsed (its relay frozen or stalled past its hold, its session
    ended, its round still sending): a fault of :data:`LAPSING` between the
    row's commit and its mark. A later record with no such fault came from a
    claim taken after the mark (``resent_unexplained``), a violation.
    """
    name = "no sent message claimed again"
    lapsed = sum(int(f.attrs.get("lapsed", 0)) for f in history.faults)
    if not records.outbox:
        return Verdict(name=name, passed=True, note=NO_EFFECTS)
    by_id = {row.effect_id: row for row in records.outbox}
    violations = [
        f"{_named(by_id[r.effect_id]) if r.effect_id in by_id else r.effect_id}: claimed again"
        f" by {r.relay or 'a relay'} after it was marked sent"
        for r in records.reclaims or ()
    ]
    delivered = _deliveries(records)
    later = unexplained = 0
    for row in records.outbox:
        if row.sent is None:
            continue
        got = delivered.get(row.effect_id, [])
        resent = [d for d in got if d.created > row.sent + CLOCK_SLACK]
        later += len(resent)
        if len(resent) == len(got):  # none before the mark: marked unacknowledged (#395), above
            continue
        if resent and not _lapse_before_mark(history, records, row):
            unexplained += 1
            violations.append(
                f"{_named(row)}: sent again {min(d.created for d in resent) - row.sent:.3f}s"
                " after it was marked sent, no claim lapsed before the mark: claimed again"
            )
    counts: dict[str, Scalar] = {
        "claims_lapsed": lapsed,
        "send_refusals": sum(1 for f in history.faults if f.kind == "effects_refused"),
        "resent_later": later,
        "resent_unexplained": unexplained,
        "claimed_again": "not audited" if records.reclaims is None else len(records.reclaims),
    }
    return verdict(name, counts, violations)


LAPSING = (
    "pod_pause",
    "loop_stall",
    "store_outage",
    "store_promote",
    "kafka_restart",
    "broker_kill",
    "broker_rolling_restart",
    "outbox_claims_lapse",
    "pod_isolate",
)
"""Fault kinds that can end a relay's claim while its round still sends.

A frozen or stalled pod's relay outlives its hold; a store outage or a
promotion ends its claim's session; a slow broker stretches its waves; the
lapse fault ends claims; an isolated pod's relay can neither mark nor hear
its sends until it is healed.
"""


def _lapse_before_mark(history: History, records: Records, row: Outboxed) -> bool:
    """Whether a :data:`LAPSING` fault was on between ``row``'s commit and its sent mark."""
    assert row.sent is not None
    born, marked = row.committed - records.wall_offset, row.sent - records.wall_offset
    return any(
        f.kind in LAPSING and f.start <= marked and (f.end is None or f.end >= born)
        for f in history.faults
    )


EFFECT_RULES: tuple[Callable[[History, Records], Verdict], ...] = (
    effects_delivered,
    effects_processed_once,
    no_stale_effects,
    no_sent_message_claimed_again,
)
"""The effects' invariants, in report order."""


def _deliveries(records: Records) -> dict[str, list[Delivery]]:
    found: dict[str, list[Delivery]] = defaultdict(list)
    for delivery in records.deliveries:
        if delivery.effect_id is not None:
            found[delivery.effect_id].append(delivery)
    return found


def _across(
    history: History, records: Records, delivered: dict[str, list[Delivery]]
) -> dict[str, int]:
    """Count the delivered effects a fault of each kind struck between commit and delivery."""
    struck: Counter[str] = Counter()
    for row in records.outbox:
        got = delivered.get(row.effect_id)
        if not got:
            continue
        born = row.committed - records.wall_offset
        arrived = min(d.received for d in got) - records.wall_offset
        for kind in ACROSS:
            if any(
                f.kind == kind and f.start <= arrived and (f.end or f.start) >= born
                for f in history.faults
            ):
                struck[kind] += 1
    return {kind: struck[kind] for kind in ACROSS}


def _named(row: Outboxed) -> str:
    return f"{row.job_key} version {row.input_version} effect {row.effect_id.rsplit(':', 1)[-1]}"
