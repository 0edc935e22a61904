"""What happens to a job's messages after ``publish()``: one :class:`EffectEvent` per step.

The execution reports each message it publishes (``published``), the outbox
relay each send and what is left to send (``sent``, ``send_failed``,
``backlog``), and a receiver's inbox each effect it decided on
(``received``). Telemetry makes the spans and metrics of docs/telemetry.md
from them; events carry identifiers, topics and fences, never payloads.
"""

from __future__ import annotations

from collections.abc import MutableSequence, Sequence
from dataclasses import dataclass
from typing import Literal

from ._identity import Attempt

EffectEventName = Literal["published", "sent", "send_failed", "backlog", "received"]

TraceHeaders = Sequence[tuple[str, bytes]]
"""W3C trace context headers (``traceparent``, ``tracestate``) as Kafka header pairs."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EffectEvent:
    """One step of a job's messages; fields that do not apply are ``None``.

    ``published`` (in the execution's task): ``attempt`` published message
    ``effect_id`` to ``topic``; ``carrier`` is where a hook writes the trace
    context the message is to carry (a tracing hook writes its ``publish``
    span's; when nobody writes, the message carries the trigger's).
    ``sent`` (in the relay's task): the broker acknowledged the message at
    ``partition``/``offset``; the send began at ``began`` (anyio's clock) and
    took ``elapsed`` seconds; ``trace`` is the trace context the message
    carries. ``send_failed``: the same, with the ``error`` (its type is
    what may be logged). ``backlog``: the store holds ``depth`` unsent
    messages of ``namespace``'s job keys (``None``: of every key), the oldest
    committed ``oldest_age`` seconds ago (``None``: none); ``depth`` ``None``:
    this pod stopped reporting them (another pod does).
    ``received``: ``receiver``'s inbox answered ``status`` (``new``,
    ``duplicate``, ``stale``) for the effect. ``job_key`` is the store's key
    of the committing job (``{namespace}:{<job key>}``), ``fence`` the
    committing execution's fence, ``relay`` the relay's name.
    """

    name: EffectEventName
    topic: str | None = None
    effect_id: str | None = None
    job_key: str | None = None
    fence: int | None = None
    attempt: Attempt | None = None
    carrier: MutableSequence[tuple[str, bytes]] | None = None
    trace: TraceHeaders = ()
    partition: int | None = None
    offset: int | None = None
    began: float | None = None
    elapsed: float = 0.0
    error: BaseException | None = None
    relay: str | None = None
    depth: int | None = None
    oldest_age: float | None = None
    namespace: str | None = None
    receiver: str | None = None
    status: str | None = None
