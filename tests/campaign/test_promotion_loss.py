"""What an asynchronous promotion lost is counted and names its keys; nothing else is excused.

One planted history: fence 10's completion of v1 accepted, the store's
primary killed and its asynchronous standby promoted without it, the same
trigger recomputed by fence 11 and accepted again. Two accepted completions
of one version: a violation for our checker and for Porcupine, unless a
promotion's window names the key as lost, and only an asynchronous one.
"""

from __future__ import annotations

import pytest

from leaseworker._history import Step
from leaseworker.toolkit import Execution, FaultWindow, History
from leaseworker_dev._campaign import (
    Produced,
    Records,
    Stored,
    Verdict,
    check,
    outside_available,
    outside_verdict,
)

KEY = "report:acme:2026-11"
OTHER = "report:other:2026-11"
ONE_COMPLETION = "one completion per identity, highest fence, none stale"
PROMOTIONS = "nothing committed lost by a promotion to a synchronous standby"


def _accepted(eid: str, start: float, fence: int) -> Execution:
    step = Step(at=start + 0.5, name="completion", duration=0.05, attrs={"status": "accepted"})
    return Execution(
        job_key=KEY,
        execution_id=eid,
        pod=f"pod-{eid}",
        start=start,
        end=start + 1.0,
        fence=fence,
        input_version="v1",
        outcome="completed",
        completion="accepted",
        steps=(step,),
        partition=0,
        offset=0 if eid == "a" else 1,
    )


def _promotion(*, synchronous: bool, keys: str) -> FaultWindow:
    return FaultWindow(
        kind="store_promote",
        start=2.0,
        end=3.0,
        attrs={
            "synchronous": synchronous,
            "lost_completions": 1,
            "lost_claims": 1,
            "lost_outbox_rows": 0,
            "lost_sent_marks": 0,
            "lost_keys": keys,
            "lost_effects": "",
        },
    )


def _history(promotion: FaultWindow) -> History:
    executions = (_accepted("a", 0.0, 10), _accepted("b", 4.0, 11))
    return History(clock="monotonic", executions=executions, faults=(promotion,))


RECORDS = Records(
    produced=(
        Produced(partition=0, offset=0, job_key=KEY, input_version="v1"),
        Produced(partition=0, offset=1, job_key=KEY, input_version="v1"),
    ),
    committed={0: 2},
    completions={(KEY, "v1"): Stored(fence=11, execution_id="b")},
)


def _verdicts(history: History) -> dict[str, Verdict]:
    return {v.name: v for v in check(history, RECORDS)}


def test_a_recomputation_the_asynchronous_loss_explains_is_counted_not_a_violation() -> None:
    """The loss names the key: both accepted completions counted, the loss summed."""
    verdicts = _verdicts(_history(_promotion(synchronous=False, keys=KEY)))
    assert all(v.passed for v in verdicts.values()), [v.line() for v in verdicts.values()]
    counts = verdicts[ONE_COMPLETION].counts
    assert (counts["recomputed_after_loss"], counts["lower_fence_after_loss"]) == (1, 0)
    lost = verdicts[PROMOTIONS].counts
    assert lost["promotions"] == 1
    assert lost["synchronous"] == 0
    assert (lost["async_lost_completions"], lost["async_lost_claims"]) == (1, 1)
    assert lost["async_lost_keys"] == 1


def test_a_loss_on_another_key_or_a_synchronous_promotion_excuses_nothing() -> None:
    """The same two acceptances fail when the loss names another key, or the standby was sync."""
    elsewhere = _verdicts(_history(_promotion(synchronous=False, keys=OTHER)))
    assert not elsewhere[ONE_COMPLETION].passed
    assert elsewhere[ONE_COMPLETION].violations[0] == f"{KEY} version v1: 2 completions accepted"
    assert elsewhere[PROMOTIONS].passed  # counted as an asynchronous promotion's loss
    synchronous = _verdicts(_history(_promotion(synchronous=True, keys=KEY)))
    assert not synchronous[ONE_COMPLETION].passed
    assert not synchronous[PROMOTIONS].passed
    assert synchronous[PROMOTIONS].violations == (
        f"the promotion at 2.000 lost 1 completions, 1 claims (keys {KEY})",
    )


@pytest.mark.skipif(not outside_available(), reason="no Go toolchain to build porcupine")
def test_porcupine_names_the_keys_the_loss_explains_and_fails_the_others() -> None:
    """Refused either way; explained (passing, the keys named) only where the loss was."""
    explained = outside_verdict(_history(_promotion(synchronous=False, keys=KEY)), RECORDS)
    assert explained.passed
    assert explained.note == (
        f"NOT linearizable, explained by the asynchronous promotion's loss (keys {KEY})"
    )
    assert explained.counts["explained_keys"] == 1
    unexplained = outside_verdict(_history(_promotion(synchronous=False, keys=OTHER)), RECORDS)
    assert not unexplained.passed
    assert unexplained.violations == (f"NOT linearizable (keys {KEY})",)
