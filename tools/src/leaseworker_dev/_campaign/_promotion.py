"""The ``store_promote`` fault: the store's primary killed, its standby promoted, and what was lost.

:func:`promote` plays it on a :class:`~leaseworker_dev._services.LocalPostgresPair`:
it reads the primary's store state (every job key's fences, the completions,
the outbox rows and which are sent), SIGKILLs the primary and its children at
once, waits the planned down time (a failover manager noticing), promotes the
standby, reads the same state there and compares: what the primary had
committed and the promoted node lacks is what the promotion lost. A commit
other sessions see on a synchronous primary is on its standby already, so a
synchronous promotion must lose nothing; an asynchronous one loses what the
standby had not received. The commits of the milliseconds between the first
read and the kill are not in it (an undercount, never a false loss). Then the
former primary is replaced by a fresh standby on its address (the pods' URL
names both), so the next promotion can play.

The loss travels in the fault's window (its attrs, scalars), where the
checker finds it: :func:`explained_keys` and :func:`lost_effects` name what
an asynchronous promotion's loss explains.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from leaseworker.toolkit import FaultWindow, History, Scalar

from .._services import LocalPostgres, LocalPostgresPair
from ._invariant_verdict import Verdict

KIND = "store_promote"

DATABASE = "leaseworker"
"""The pair's database the campaign's store lives in."""


@dataclass(frozen=True, slots=True)
class StoreState:
    """What one node holds: per store key its highest fence shown, completions, outbox rows."""

    heads: dict[str, int]  # store key -> greatest(fence, claimed_fence)
    completions: frozenset[tuple[str, str]]  # (store key, input version)
    outbox: dict[int, tuple[str, str]]  # row id -> (store key, effect id)
    sent: frozenset[int]  # row ids marked sent


def read_state(node: LocalPostgres) -> StoreState:
    """Read ``node``'s store state (superuser, the campaign's database)."""
    heads = node.query(
        b"SELECT job_key, greatest(fence, claimed_fence) FROM leaseworker_jobs", database=DATABASE
    )
    done = node.query(
        b"SELECT job_key, input_version FROM leaseworker_completions", database=DATABASE
    )
    rows = node.query(
        b"SELECT id, job_key, effect_id, sent_at IS NOT NULL FROM leaseworker_outbox_state",
        database=DATABASE,
    )
    return StoreState(
        heads={str(key): int(fence) for key, fence in heads},
        completions=frozenset((str(key), str(version)) for key, version in done),
        outbox={int(i): (str(key), str(effect)) for i, key, effect, _ in rows},
        sent=frozenset(int(i) for i, _, _, sent in rows if sent),
    )


@dataclass(frozen=True, slots=True)
class Loss:
    """What the primary had committed and the promoted node lacks."""

    completions: int
    claims: int  # keys whose highest fence went back
    outbox_rows: int
    sent_marks: int  # rows sent on the primary, unsent after
    keys: tuple[str, ...]  # the job keys (the user's) of any of them
    effects: tuple[str, ...]  # the effect ids of the lost rows

    def attrs(self) -> dict[str, Scalar]:
        """Return the fault window's attrs: counts, and the keys and effect ids space-separated."""
        return {
            "lost_completions": self.completions,
            "lost_claims": self.claims,
            "lost_outbox_rows": self.outbox_rows,
            "lost_sent_marks": self.sent_marks,
            "lost_keys": " ".join(self.keys),
            "lost_effects": " ".join(self.effects),
        }


def compare(before: StoreState, after: StoreState) -> Loss:
    """Return what ``before`` (the primary) held that ``after`` (the promoted node) lacks."""
    completions = before.completions - after.completions
    claims = {k for k, fence in before.heads.items() if after.heads.get(k, -1) < fence}
    rows = {i: v for i, v in before.outbox.items() if i not in after.outbox}
    marks = {i for i in before.sent - after.sent if i in after.outbox}
    store_keys = {k for k, _ in completions} | claims | {k for k, _ in rows.values()}
    store_keys |= {after.outbox[i][0] for i in marks}
    return Loss(
        completions=len(completions),
        claims=len(claims),
        outbox_rows=len(rows),
        sent_marks=len(marks),
        keys=tuple(sorted({user_key(k) for k in store_keys})),
        effects=tuple(sorted(effect for _, effect in rows.values())),
    )


def user_key(store_key: str) -> str:
    """``{namespace}:{<job key>}`` back to the job key."""
    return store_key.partition(":")[2].removeprefix("{").removesuffix("}")


def promote(pair: LocalPostgresPair, down_for: float) -> tuple[float, float, Loss]:
    """Play the fault (blocking): read, kill, wait, promote, read, rejoin.

    Returns the kill's and the promotion's moments (monotonic) and the loss.
    """
    before = read_state(pair.primary)
    killed = time.monotonic()
    pair.kill_primary()
    time.sleep(down_for)
    promoted_node = pair.promote()
    promoted = time.monotonic()
    loss = compare(before, read_state(promoted_node))
    pair.rejoin()
    return killed, promoted, loss


def _asynchronous(faults: Iterable[FaultWindow]) -> list[FaultWindow]:
    return [f for f in faults if f.kind == KIND and f.attrs.get("synchronous") is False]


def explained_keys(history: History) -> frozenset[str]:
    """Return the job keys whose store state an asynchronous promotion lost."""
    return frozenset(
        key
        for f in _asynchronous(history.faults)
        for key in str(f.attrs.get("lost_keys", "")).split()
    )


def lost_effects(history: History) -> frozenset[str]:
    """Return the effect ids whose outbox rows an asynchronous promotion lost."""
    return frozenset(
        e
        for f in _asynchronous(history.faults)
        for e in str(f.attrs.get("lost_effects", "")).split()
    )


def loss_note(history: History, verdicts: list[Verdict]) -> str | None:
    """Return the report's line on what the asynchronous promotions lost and let through.

    ``None`` when none played. The let-through counts come from the verdicts
    that found them on the keys the loss names.
    """
    played = _asynchronous(history.faults)
    if not played:
        return None
    lost = {
        what: sum(int(f.attrs.get(f"lost_{what}", 0) or 0) for f in played)
        for what in ("completions", "claims", "outbox_rows", "sent_marks")
    }
    counts: dict[str, Scalar] = {}
    for verdict in verdicts:
        counts |= verdict.counts
    keys = sorted(explained_keys(history))
    return (
        f"lost by the asynchronous promotion ({len(played)} played): "
        + ", ".join(f"{n} {what.replace('_', ' ')}" for what, n in lost.items())
        + f" (keys: {' '.join(keys) or 'none'}); let through: "
        f"{counts.get('recomputed_after_loss', 0)} triggers recomputed, "
        f"{counts.get('lower_fence_after_loss', 0)} lower fences accepted"
    )
