"""The outside checker: the campaign's store operations judged by Porcupine, not by our code.

Each job key of the completion store is a register of (highest fence seen,
versions completed); Porcupine (github.com/anishathalye/porcupine, a Go
module in ``tools/porcupine``, built and cached as Jaeger is) says whether
the answers the pods got can be placed, one at a time, inside their calls.
:func:`operations` turns a history and the store's records into that
program's input (``leaseworker.ops/1``, see docs/chaos.md): per execution a
claim from its start (its answer unseen, open to the end unless a completion
followed it) and its completion with the store's answer; a completion the
store holds but no answer in the history shows (the pod killed, or a retry
answered ``duplicate`` to its own earlier try) is an accepted completion of
unknown time after the execution's start. Overlapping executions are not a
linearizability question: ``_checker`` judges those.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from leaseworker.toolkit import History, Scalar

from .._services import ToolMissingError, cache_dir, shipped
from ._campaign_records import Records
from ._invariant_verdict import Verdict
from ._promotion import explained_keys

FORMAT = "leaseworker.ops/1"
"""The first line of the checker's input."""

PORCUPINE_VERSION = "v1.3.1"
"""The Porcupine release pinned in ``tools/porcupine/go.mod``."""

NAME = "outside checker (porcupine)"
"""The verdict's name in the campaign's report."""


def operations(history: History, records: Records) -> list[dict[str, Any]]:
    """Return the store operations ``history`` and ``records`` show (``leaseworker.ops/1``)."""
    ops: list[dict[str, Any]] = []
    shown: set[tuple[str, str]] = set()  # identities whose accepted completion has a call
    executions = sorted(history.executions, key=lambda e: (e.start, e.execution_id))
    starts = {e.execution_id: e.start for e in executions}
    for client, execution in enumerate(executions):
        if execution.fence is None:
            continue
        steps = [s for s in execution.steps if s.name == "completion"]
        claim_return = _ns(steps[0].at) if steps and execution.input_version is not None else None
        ops.append(
            _op(execution.job_key, client, "claim", execution.input_version or "", execution.fence)
            | {"call": _ns(execution.start), "return": claim_return, "status": None}
        )
        if execution.input_version is None:
            continue
        identity = (execution.job_key, execution.input_version)
        stored = records.completions.get(identity)
        for step in steps:
            status = str(step.attrs.get("status", ""))
            if status not in ("accepted", "duplicate", "stale"):
                continue
            if stored is not None and stored.execution_id == execution.execution_id:
                status = "accepted"  # a retry's duplicate: its own earlier try was taken
            if status == "accepted":
                shown.add(identity)
            fence = _fence(step.attrs.get("fence"), execution.fence)
            ops.append(
                _op(execution.job_key, client, "complete", execution.input_version, fence)
                | {"call": _ns(step.at), "return": _ns(step.at + step.duration), "status": status}
            )
    for client, (identity, stored) in enumerate(sorted(records.completions.items()), len(ops)):
        if identity in shown:
            continue
        call = _ns(starts.get(stored.execution_id, 0.0))
        ops.append(
            _op(identity[0], client, "complete", identity[1], stored.fence)
            | {"call": call, "return": None, "status": "accepted"}
        )
    return _bounded(ops)


def _bounded(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Close what an open claim can still change: nothing, once a fence as high is in.

    A claim only raises the key's highest fence. Once a claim or an accepted
    completion of a fence at least as high has returned, placing the open
    claim later changes nothing, so it may as well end there (or be left out,
    when that one returned before it was even sent). The same judgement, a
    search Porcupine can finish: every open claim left in is one more place
    it tries in every order when a history is bad.
    """
    raised: dict[str, list[tuple[int, int]]] = {}  # key -> (fence, return) of known raisers
    for op in ops:
        if op["return"] is not None and (op["op"] == "claim" or op["status"] == "accepted"):
            raised.setdefault(op["key"], []).append((op["fence"], op["return"]))
    kept = []
    for op in ops:
        if op["op"] == "claim" and op["return"] is None:
            ends = [end for fence, end in raised.get(op["key"], ()) if fence >= op["fence"]]
            if ends and min(ends) < op["call"]:
                continue  # a no-op wherever it falls
            op = op | {"return": min(ends, default=None)}
        kept.append(op)
    return kept


def document(ops: list[dict[str, Any]]) -> str:
    """Return the checker's input: the format line, then one operation a line."""
    lines = [json.dumps({"format": FORMAT}), *(json.dumps(op, separators=(",", ":")) for op in ops)]
    return "\n".join(lines) + "\n"


def judge(ops: list[dict[str, Any]], *, timeout: float = 60.0) -> dict[str, Any]:
    """Run the built checker over ``ops``; its answer (``linearizable``, ``illegal``, ...).

    Raises :class:`RuntimeError` with the checker's error when it could not judge.
    """
    binary = ensure_built()
    done = subprocess.run(
        [str(binary), "-timeout", f"{timeout}s"],
        input=document(ops),
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout * max(1, len({op["key"] for op in ops})) + 30,
    )
    if done.returncode not in (0, 1) or not done.stdout.strip():
        raise RuntimeError(f"the porcupine checker failed ({done.returncode}): {done.stderr}")
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def outside_verdict(history: History, records: Records, *, keep: Path | None = None) -> Verdict:
    """Porcupine's verdict on the store operations of ``history`` and ``records``.

    ``keep``: a file to write the checker's input to first (a campaign's scratch directory).
    A key it refuses whose store state an asynchronous promotion lost is
    named as explained by the loss (passing); any other refused key fails.
    """
    ops = operations(history, records)
    if keep is not None:
        keep.write_text(document(ops), encoding="utf-8")
    answer = judge(ops)
    counts: dict[str, Scalar] = {"keys": answer["keys"], "operations": answer["operations"]}
    if answer["linearizable"]:
        return Verdict(name=NAME, passed=True, counts=counts, note="linearizable")
    explained = explained_keys(history)
    excused = [key for key in answer["illegal"] if key in explained]
    illegal = [key for key in answer["illegal"] if key not in explained]
    unknown = answer["unknown"]
    violations = []
    if illegal:
        violations.append(f"NOT linearizable (keys {', '.join(illegal[:10])})")
    if unknown:
        violations.append(f"not decided in time (keys {', '.join(unknown[:10])})")
    note = ""
    if excused:
        counts["explained_keys"] = len(excused)
        note = (
            f"NOT linearizable, explained by the asynchronous promotion's loss "
            f"(keys {', '.join(excused[:10])})"
        )
    if not violations:
        return Verdict(name=NAME, passed=True, counts=counts, note=note)
    if note:
        violations.append(note)
    return Verdict(name=NAME, passed=False, counts=counts, violations=tuple(violations))


def available() -> bool:
    """Whether the checker is built or can be (the Go toolchain is here)."""
    try:
        return binary_path().is_file() or _go() is not None
    except ToolMissingError:  # its sources are missing from this installation
        return False


def binary_path() -> Path:
    """Where the built checker lives (it may not exist yet), named by its sources' digest.

    A changed model (``main.go``) builds anew instead of running an older cached binary.
    """
    module = shipped("tools/porcupine/go.mod").parent
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum", "main.go"):
        digest.update((module / name).read_bytes())
    return cache_dir(f"porcupine-{PORCUPINE_VERSION}-{digest.hexdigest()[:12]}") / "porcupine"


def ensure_built() -> Path:
    """Build the checker unless the cached binary exists; return its path.

    Written to a temporary name and renamed into place, so an interrupted
    build never leaves a binary that looks complete.
    """
    binary = binary_path()
    if binary.is_file():
        return binary
    go = _go()
    if go is None:
        raise ToolMissingError("the Go toolchain is not on PATH; the porcupine checker needs it")
    partial = binary.with_name(f"porcupine.partial-{os.getpid()}")
    built = subprocess.run(
        [go, "build", "-o", str(partial), "."],
        cwd=shipped("tools/porcupine/go.mod").parent,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    if built.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"go build of the porcupine checker failed: {built.stderr[-2000:]}")
    partial.replace(binary)
    return binary


def _go() -> str | None:
    return shutil.which("go") or shutil.which("go", path="/usr/local/go/bin")


def _op(key: str, client: int, op: str, version: str, fence: int) -> dict[str, Any]:
    return {"key": key, "client": client, "op": op, "version": version, "fence": fence}


def _fence(value: Scalar | None, default: int) -> int:
    return int(value) if isinstance(value, int | float) and value else default


def _ns(seconds: float) -> int:
    return round(seconds * 1_000_000_000)
