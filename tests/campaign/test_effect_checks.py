"""The effects' checks fail on each planted violation, and pass a clean history.

One consistent history (execution ``a`` lost, ``b`` completed with fence 11
and published one message, relayed, delivered once, processed once), then one
thing broken per test, Spring Modulith's two failure modes among them: a
message marked sent although the broker never had it (#395) and a sent
message claimed again (#1935). A checker that cannot fail is a defect.
"""

from __future__ import annotations

import dataclasses

from leaseworker.effects import effect_id
from leaseworker.toolkit import FaultWindow, History
from leaseworker_dev._campaign import Records, Stored, Verdict, check
from leaseworker_dev._campaign._campaign_records import Delivery, Outboxed, Reclaim

from .test_checker import CLEAN, KEY, RECORDS

EFFECT = effect_id(f"ns:{{{KEY}}}", "v1", 0)
ROW = Outboxed(
    effect_id=EFFECT,
    job_key=KEY,
    input_version="v1",
    fence=11,
    topic="reports.ready",
    committed=1000.0,
    sent=1000.2,
)
DELIVERY = Delivery(
    effect_id=EFFECT,
    fence=11,
    status="new",
    topic="reports.ready",
    partition=0,
    offset=0,
    created=1000.1,
    received=1000.3,
)
WITH_EFFECTS = dataclasses.replace(
    RECORDS, outbox=(ROW,), deliveries=(DELIVERY,), processed={EFFECT: 1}, wall_offset=1000.0
)
NAMES = (
    "every accepted completion's effects delivered, none lost",
    "each effect processed once by the receiver",
    "no effect from a stale or superseded execution",
    "no sent message claimed again",
)


def _effects(records: Records, history: History = CLEAN) -> dict[str, Verdict]:
    return {v.name: v for v in check(history, records) if v.name in NAMES}


def _failed(records: Records, history: History = CLEAN) -> dict[str, Verdict]:
    return {name: v for name, v in _effects(records, history).items() if not v.passed}


def test_a_clean_history_with_effects_passes_and_counts_them() -> None:
    """One effect, committed by the accepted fence, delivered once, processed once."""
    verdicts = _effects(WITH_EFFECTS)
    assert all(v.passed for v in verdicts.values()), [v.line() for v in verdicts.values()]
    assert verdicts[NAMES[0]].counts["delivered"] == 1
    assert verdicts[NAMES[1]].counts["processed"] == 1


def test_a_job_without_effects_says_so() -> None:
    """No outbox rows, no deliveries: each effect check passes with "no effects"."""
    verdicts = _effects(RECORDS)
    assert all(v.passed for v in verdicts.values())
    assert all(v.line().endswith("(no effects)") for v in verdicts.values())


def test_a_message_marked_sent_that_the_broker_never_had_is_lost() -> None:
    """Spring Modulith #395: the send failed, the row was marked sent anyway."""
    failed = _failed(dataclasses.replace(WITH_EFFECTS, deliveries=(), processed={}))
    assert list(failed) == [NAMES[0]]
    assert "never delivered although marked sent" in failed[NAMES[0]].violations[0]


def test_a_message_marked_sent_before_the_broker_had_it_fails() -> None:
    """#395 again, then a later resend: the first record was created after the mark."""
    late = dataclasses.replace(DELIVERY, created=1000.5)
    failed = _failed(dataclasses.replace(WITH_EFFECTS, deliveries=(late,)))
    assert list(failed) == [NAMES[0]]
    assert "before the broker had it" in failed[NAMES[0]].violations[0]


def test_a_message_never_sent_fails() -> None:
    """Committed and left in the outbox (a relay that gave up)."""
    unsent = dataclasses.replace(ROW, sent=None)
    failed = _failed(dataclasses.replace(WITH_EFFECTS, outbox=(unsent,), deliveries=()))
    assert failed[NAMES[0]].counts["unsent"] == 1


def test_a_sent_message_claimed_again_fails() -> None:
    """Spring Modulith #1935: the store's audit saw a claim on a row already sent."""
    reclaim = Reclaim(effect_id=EFFECT, relay="pod-2:abcd", at=1001.0)
    failed = _failed(dataclasses.replace(WITH_EFFECTS, reclaims=(reclaim,)))
    assert list(failed) == [NAMES[3]]
    assert "claimed again by pod-2:abcd" in failed[NAMES[3]].violations[0]


def test_an_unaudited_store_says_so() -> None:
    """Records without the store's audit (``reclaims=None``): the check says so."""
    line = check(CLEAN, dataclasses.replace(WITH_EFFECTS, reclaims=None))[-1].line()
    assert "claimed_again=not audited" in line


# The row committed at 1000.0 and was marked sent at 1000.2 (monotonic 0.0 and 0.2).
RESENT = dataclasses.replace(DELIVERY, offset=1, created=1001.5, received=1001.6)


def test_a_sent_message_sent_again_with_no_lapse_was_claimed_again() -> None:
    """A row lock's claim writes nothing; its send after the mark shows it, unaudited store too.

    No claim lapsed before the mark, so only a claim taken after it can have sent it.
    """
    resent = dataclasses.replace(WITH_EFFECTS, deliveries=(DELIVERY, RESENT), reclaims=None)
    failed = _failed(resent)
    assert list(failed) == [NAMES[3]]
    assert "sent again 1.300s after it was marked sent" in failed[NAMES[3]].violations[0]
    assert failed[NAMES[3]].counts["resent_unexplained"] == 1


def test_a_send_after_the_mark_by_a_relay_whose_claim_lapsed_passes() -> None:
    """A lapsing fault between the commit and the mark explains a late send: at least once."""
    resent = dataclasses.replace(WITH_EFFECTS, deliveries=(DELIVERY, RESENT))
    for kind in ("pod_pause", "outbox_claims_lapse", "store_outage"):
        lapse = FaultWindow(kind=kind, start=0.1, end=3.0, target="pod-a")
        verdict = _effects(resent, dataclasses.replace(CLEAN, faults=(lapse,)))[NAMES[3]]
        assert verdict.passed, verdict.violations
        assert (verdict.counts["resent_later"], verdict.counts["resent_unexplained"]) == (1, 0)
    after = FaultWindow(kind="pod_pause", start=0.5, end=3.0, target="pod-a")  # after the mark
    assert not _effects(resent, dataclasses.replace(CLEAN, faults=(after,)))[NAMES[3]].passed


def test_a_duplicate_delivery_is_dropped_but_a_second_processing_fails() -> None:
    """The relay may send twice (at least once); the receiver's effect must happen once."""
    again = dataclasses.replace(DELIVERY, offset=1, status="duplicate")
    assert not _failed(dataclasses.replace(WITH_EFFECTS, deliveries=(DELIVERY, again)))
    twice = dataclasses.replace(WITH_EFFECTS, deliveries=(DELIVERY, again), processed={EFFECT: 2})
    assert "processed 2 times" in _failed(twice)[NAMES[1]].violations[0]


def test_a_delivered_effect_the_inbox_dropped_as_stale_was_never_processed() -> None:
    """An accepted completion's effect must be processed: dropping it as stale is a loss."""
    dropped = dataclasses.replace(DELIVERY, status="stale")
    failed = _failed(dataclasses.replace(WITH_EFFECTS, deliveries=(dropped,), processed={}))
    assert list(failed) == [NAMES[1]]
    assert "never processed (stale)" in failed[NAMES[1]].violations[0]


def test_an_effect_processed_that_was_never_committed_fails() -> None:
    """A receiver processing something no transaction committed."""
    phantom = dataclasses.replace(WITH_EFFECTS, processed={EFFECT: 1, "lw1:ghost:0": 1})
    assert "never committed" in _failed(phantom)[NAMES[1]].violations[0]


def test_an_effect_of_the_stale_execution_fails() -> None:
    """The late transaction of ``a`` (fence 10, refused) wrote a message after all."""
    stale_a = dataclasses.replace(CLEAN.executions[0], completion="stale")
    history = dataclasses.replace(CLEAN, executions=(stale_a, CLEAN.executions[1]))
    leaked = dataclasses.replace(ROW, effect_id=effect_id("x", "v1", 1), fence=10)
    records = dataclasses.replace(WITH_EFFECTS, outbox=(ROW, leaked))
    failed = _failed(records, history)
    assert "committed by fence 10, refused as stale" in failed[NAMES[2]].violations[0]


def test_an_effect_off_the_accepted_fence_or_without_a_completion_fails() -> None:
    """Committed by a fence the store did not accept, or for an identity never completed."""
    newer = {(KEY, "v1"): Stored(fence=12, execution_id="c")}
    other = dataclasses.replace(WITH_EFFECTS, completions=newer)
    assert "the accepted completion's is 12" in _failed(other)[NAMES[2]].violations[0]
    orphan = dataclasses.replace(WITH_EFFECTS, completions={})
    assert "without its completion" in _failed(orphan)[NAMES[2]].violations[0]


def test_a_record_carrying_another_fence_than_its_row_fails() -> None:
    """The relay must send the committing execution's fence."""
    wrong = dataclasses.replace(DELIVERY, fence=10)
    failed = _failed(dataclasses.replace(WITH_EFFECTS, deliveries=(wrong,)))
    assert "delivered with fence 10" in failed[NAMES[2]].violations[0]


def test_effects_in_flight_through_a_fault_are_counted_by_kind() -> None:
    """A pod kill between the commit (monotonic 0.0) and the delivery (0.3) is counted."""
    kill = FaultWindow(kind="pod_kill", start=0.1, end=0.1, target="pod-b")
    history = dataclasses.replace(CLEAN, faults=(kill,))
    counts = _effects(WITH_EFFECTS, history)[NAMES[0]].counts
    assert counts["across_pod_kill"] == 1
    assert counts["across_kafka_restart"] == 0
