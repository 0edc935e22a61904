"""Whether a campaign exercised the job enough for its PASS lines to mean anything.

A campaign whose triggers were all dead-lettered (a payload generator that
does not fit the job), or whose faults all struck idle pods, passes every
invariant vacuously. :func:`exercise` counts the executions, the accepted
completions and the faults that struck a running execution, compares them
with minimums drawn from the campaign's size, and says why it is
inconclusive when one falls short.
"""

from __future__ import annotations

from dataclasses import dataclass

from leaseworker.toolkit import Execution, FaultWindow, History

from ._campaign_records import Records

HITS_SHARE = 10
"""At least one played fault in this many must strike a running execution (and at least one)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Exercise:
    """What the campaign exercised, the minimums, and why it is inconclusive (or ``None``)."""

    executions: int
    completions: int
    hits: int
    faults: int
    minimums: tuple[int, int, int]
    inconclusive: str | None = None

    def line(self) -> str:
        """``97 executions, 31 completions, 17 of 20 faults hit a running execution (...)``."""
        return (
            f"{self.executions} executions, {self.completions} completions, {self.hits} of "
            f"{self.faults} faults hit a running execution (at least "
            f"{', '.join(map(str, self.minimums))})"
        )


def exercise(history: History, records: Records, *, keys: int, payloads: str | None) -> Exercise:
    """Count what ``history`` exercised; ``payloads`` is the ``--payloads`` spec (or default)."""
    played = len(history.faults)
    minimums = (keys, (keys + 1) // 2, max(1, played // HITS_SHARE) if played else 0)
    found = Exercise(
        executions=len(history.executions),
        completions=sum(1 for e in history.executions if e.completion == "accepted"),
        hits=sum(1 for f in history.faults if _hit(f, history.executions)),
        faults=played,
        minimums=minimums,
    )
    short = [
        f"{value} {what} (at least {least})"
        for value, what, least in zip(
            (found.executions, found.completions, found.hits),
            ("executions", "completions", "faults that hit a running execution"),
            minimums,
            strict=True,
        )
        if value < least
    ]
    if not short:
        return found
    reason = f"the campaign barely exercised the job: {', '.join(short)}"
    dead = len(records.dead_letters)
    if records.produced and dead * 2 > len(records.produced):
        why = next((d.reason for d in records.dead_letters if d.reason), "no reason given")
        generator = f"--payloads {payloads}" if payloads else "the default trigger generator"
        reason += (
            f"; {dead} of {len(records.produced)} triggers were dead-lettered ({why}): "
            f"{generator} does not fit the job, give --payloads pkg.module:function "
            "(docs/chaos.md#payloads)"
        )
    return Exercise(
        executions=found.executions,
        completions=found.completions,
        hits=found.hits,
        faults=found.faults,
        minimums=minimums,
        inconclusive=reason,
    )


def _hit(fault: FaultWindow, executions: tuple[Execution, ...]) -> bool:
    """Whether an execution (on the fault's pod, or anywhere for a shared one) ran during it."""
    end = fault.end if fault.end is not None else fault.start
    return any(
        (fault.target is None or e.pod == fault.target)
        and e.start <= end
        and (e.end if e.end is not None else float("inf")) >= fault.start
        for e in executions
    )
