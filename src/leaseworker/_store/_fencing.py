"""The values the completion store speaks in, and the one rule both backends apply.

A completion identity is ``(job key, input version)``; :func:`decide` is the
fencing rule and :func:`decide_claim` its counterpart for a claim. The durable
backends state both in SQL; ``memory://`` calls them.
See docs/design.md#the-completion-store.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, TypeGuard

from .._errors import ConfigError

Status = Literal["accepted", "duplicate", "stale"]
"""How a completion attempt ended; see :class:`CompletionResult`."""

ClaimStatus = Literal["claimed", "duplicate", "stale"]
"""How a claim ended; see :class:`ClaimResult`."""

NO_FENCE = -1
"""What the store holds as a job key's accepted or claimed fence before it has one."""

JsonValue = Any
"""A decoded JSON value (dict, list, str, int, float, bool or None)."""

MAX_FENCE = 2**63 - 1
"""Fences are stored as signed 64-bit integers (``BIGINT``); time-floored fences
(microseconds since the epoch, about 1.8e15 today) fit with room to spare."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Completion:
    """One recorded completion: the identity, the fence it was accepted with, its effect.

    ``result`` is the job's result row as decoded JSON. It is left out of the
    repr because report results may carry personal data and reprs end up in logs.
    ``completed_at`` is the store's commit-side clock, timezone-aware UTC.
    ``cpu_seconds`` and ``peak_memory`` (bytes): what the execution's
    ``run_in_process`` children had cost when it completed, if it ran any; read
    by :meth:`CompletionStore.state` (``None`` in the other answers on PostgreSQL).
    """

    job_key: str
    input_version: str
    fence: int
    result: JsonValue = field(repr=False)
    execution_id: str
    pod: str
    completed_at: datetime
    cpu_seconds: float | None = None
    peak_memory: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CompletionRequest:
    """What one :meth:`CompletionStore.complete` call asks the store to record.

    ::

        answer = await store.complete(CompletionRequest(
            job_key=key, input_version=version, fence=fence,
            result=row, execution_id=eid, pod=pod))

    - ``job_key`` and ``input_version``: the completion identity.
    - ``fence``: the fence of the lease the execution held (an int in
      ``[0, 2**63 - 1]``); below the highest fence the store has seen for the
      job key, accepted or claimed, the answer is ``stale`` (unless this
      identity completed: ``duplicate``).
    - ``result``: the job's result row, any JSON value; left out of the repr
      (it may carry personal data).
    - ``execution_id`` and ``pod``: which execution, in which pod, produced it.
    - ``cpu_seconds`` and ``peak_memory`` (bytes): what its ``run_in_process``
      children cost, kept with an accepted completion (``None``: it ran none).

    Built by the caller, checked by the store when it is completed: text no
    store could keep raises :class:`ConfigError`, a result that is not strict
    JSON ``TypeError`` or ``ValueError``, before any I/O.
    """

    job_key: str
    input_version: str
    fence: int
    result: JsonValue = field(repr=False)
    execution_id: str
    pod: str
    cpu_seconds: float | None = None
    peak_memory: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CompletionResult:
    """The answer to one :meth:`CompletionStore.complete` call.

    ``status`` is ``accepted`` (this call's completion was recorded),
    ``duplicate`` (this identity had completed already; nothing was written) or
    ``stale`` (the store has seen a higher fence for this job key: a newer
    execution completed it or claimed it; nothing was written).
    ``completion`` is what the store holds for the caller to use: the
    completion just recorded, the earlier one of this identity, or the job
    key's winning one; ``None`` only when ``stale`` and the job key has no
    completion yet (a newer fence claimed it and has not completed).
    ``fence`` is the caller's fence, ``winning_fence`` the highest fence the
    store has seen for the job key after this call, accepted or claimed.
    """

    status: Status
    job_key: str
    input_version: str
    fence: int
    winning_fence: int
    completion: Completion | None

    @property
    def result(self) -> JsonValue:
        """The result row the store holds for this call (see ``completion``), or ``None``."""
        return None if self.completion is None else self.completion.result


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimResult:
    """The answer to one :meth:`CompletionStore.claim` call.

    ``status`` is ``claimed`` (nothing stands above the caller's fence: the job
    may run), ``duplicate`` (this identity completed already: ``completion``
    is that completion, the job need not run) or ``stale`` (the store has
    seen a higher fence for the job key: the caller's lease was taken over
    before it could claim). Whatever the answer, the job key's claimed fence
    is now at least ``fence``. ``highest_fence`` is the highest fence the
    store has seen for the job key after this call, accepted or claimed.
    """

    status: ClaimStatus
    job_key: str
    input_version: str
    fence: int
    highest_fence: int
    completion: Completion | None = None


def answer_to(
    request: CompletionRequest,
    status: Status,
    *,
    winning_fence: int,
    completion: Completion | None,
) -> CompletionResult:
    """Build the :class:`CompletionResult` that answers ``request`` (its identity and fence)."""
    return CompletionResult(
        status=status,
        job_key=request.job_key,
        input_version=request.input_version,
        fence=request.fence,
        winning_fence=winning_fence,
        completion=completion,
    )


@dataclass(frozen=True, slots=True)
class Head:
    """A job key's highest accepted fence and the input version that won with it."""

    fence: int
    input_version: str


def decide(
    existing: Completion | None, head: Head | None, fence: int, *, claimed: int = NO_FENCE
) -> Status:
    """Apply the fencing rule to what stands under the job key's lock.

    An identity that already completed is a ``duplicate`` whatever the fence (a
    redelivered trigger must not recompute or rewrite); otherwise a fence below
    the highest one seen for the job key (accepted, or ``claimed`` by an
    execution that may still be running) is ``stale``; equal or higher is
    ``accepted``.
    """
    if existing is not None:
        return "duplicate"
    if fence < highest(head, claimed):
        return "stale"
    return "accepted"


def decide_claim(
    existing: Completion | None, head: Head | None, fence: int, *, claimed: int = NO_FENCE
) -> ClaimStatus:
    """Apply the claim rule: :func:`decide`'s order, ``claimed`` where it says ``accepted``.

    ``claimed`` is the job key's claimed fence before this claim. The claim is
    recorded whatever the answer (claims only ever rise: ``max``).
    """
    status = decide(existing, head, fence, claimed=claimed)
    return "claimed" if status == "accepted" else status


def claim_answer(
    job_key: str,
    input_version: str,
    fence: int,
    *,
    standing: Completion | None,
    head: Head | None,
    claimed: int,
) -> ClaimResult:
    """Answer a claim (or a transaction's opening) from what the store read under the key's lock.

    ``standing`` is the identity's completion, ``head`` the key's accepted
    head, ``claimed`` its claimed fence as read: one rule for every backend.
    """
    return ClaimResult(
        status=decide_claim(standing, head, fence, claimed=claimed),
        job_key=job_key,
        input_version=input_version,
        fence=fence,
        highest_fence=highest(head, claimed),
        completion=standing,
    )


def highest(head: Head | None, claimed: int) -> int:
    """Return the highest fence seen for a job key: its accepted head or its claim."""
    return max(NO_FENCE if head is None else head.fence, claimed)


def check_call(job_key: str, fence: int, input_version: str | None = None) -> None:
    """Reject arguments no store could record faithfully, before any I/O."""
    check_text("job key", job_key)
    if isinstance(fence, bool) or not isinstance(fence, int) or not 0 <= fence <= MAX_FENCE:
        raise ConfigError(f"fence must be an int in [0, 2**63 - 1], got {fence!r}")
    if input_version is not None:
        check_text("input version", input_version, empty_ok=True)


def check_text(what: str, value: object, *, empty_ok: bool = False) -> None:
    """Require a string without NUL, control characters or surrogate code points.

    Why: every store must keep what another store would, and give it back as
    it was. NUL and lone surrogates (which JSON decoding lets through) cannot
    be encoded for SQLite or PostgreSQL; control characters would forge log
    lines. Any other text is kept as it is. The message never quotes the value.
    """
    if not isinstance(value, str) or not (value or empty_ok):
        raise ConfigError(f"{what} must be a {'' if empty_ok else 'non-empty '}string")
    if _UNSTORABLE_CHARACTER.search(value):
        raise ConfigError(f"{what} holds NUL, a control character or a surrogate code point")


_UNSTORABLE_CHARACTER = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


_STRICT_JSON = json.JSONEncoder(allow_nan=False, separators=(",", ":"))
"""``json.dumps(result, allow_nan=False, separators=(",", ":"))``, built once."""


def encode_result(job_key: str, result: JsonValue) -> str:
    """Serialise ``result`` as strict JSON; the message never quotes the payload.

    Text holding NUL or a surrogate code point is refused too: PostgreSQL's
    ``jsonb`` cannot keep it, and every store takes the same results.
    """
    try:
        encoded = _STRICT_JSON.encode(result)
    except (TypeError, ValueError) as exc:
        # ``from None``: json's own messages may quote values from the payload.
        raise TypeError(
            f"result for {job_key!r} is not JSON-serialisable ({type(exc).__name__})"
        ) from None
    if _unstorable_text(result):
        raise ValueError(
            f"result for {job_key!r} holds text no store keeps (NUL or a surrogate code point)"
        )
    return encoded


def _unstorable_text(value: object) -> bool:
    """Whether a string in ``value`` (keys included) holds NUL or a surrogate code point."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item or _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


_SURROGATE = re.compile("[\ud800-\udfff]")


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def completion_params(request: CompletionRequest) -> dict[str, object]:
    """Check a ``complete()`` request and return its named SQL parameters (result as JSON)."""
    check_call(request.job_key, request.fence, request.input_version)
    check_text("execution id", request.execution_id)
    check_text("pod", request.pod)
    cpu, peak = request.cpu_seconds, request.peak_memory
    if cpu is not None and not (_number(cpu) and 0 <= cpu < math.inf):
        raise ConfigError(f"cpu_seconds must be None or a finite number >= 0, got {cpu!r}")
    if peak is not None and not (_whole(peak) and 0 <= peak <= MAX_FENCE):
        raise ConfigError(f"peak_memory must be None or a whole number >= 0, got {peak!r}")
    return {
        "job_key": request.job_key,
        "input_version": request.input_version,
        "fence": request.fence,
        "result": encode_result(request.job_key, request.result),
        "execution_id": request.execution_id,
        "pod": request.pod,
        "cpu_seconds": None if cpu is None else float(cpu),
        "peak_memory": peak,
    }
