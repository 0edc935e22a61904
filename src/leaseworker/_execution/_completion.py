"""The completion step: record an execution's result through the fenced store.

The input version, the completion key and :class:`Completer`, one execution's
single completion attempt. The store, not the lease, decides whether a late
completion counts, so its call is shielded from the lease's cancellation.
See docs/design.md#the-completion-step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
from typing import final

import anyio

from .._backoff import Backoff
from .._errors import StoreUnavailable
from .._events import Attempt, EffectEvent, Hooks, emit
from .._lease import HeldLease, now
from .._retry import STORE, Retries
from .._store import CompletionRequest, CompletionResult, CompletionStore, Message, effect_id
from . import _transaction
from ._result_checks import DEFAULT_MAX_RESULT_BYTES, check_result
from ._trigger import Trigger

logger = logging.getLogger("leaseworker.completion")


def default_input_version(trigger: Trigger) -> str:
    """Return the payload's string ``inputVersion``, else ``sha256:`` of the canonical payload.

    Canonical JSON: sorted keys, no whitespace, ASCII escapes. A redelivered
    record therefore has the same version (a duplicate); any change in the
    payload's inputs gives a new one (a new report).
    """
    declared = trigger.payload.get("inputVersion")
    if isinstance(declared, str) and declared:
        return declared
    canonical = _CANONICAL.encode(trigger.payload)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
"""``json.dumps(payload, sort_keys=True, separators=(",", ":"))``, built once."""


def completion_key(namespace: str, job_key: str) -> str:
    """Return the store key of ``job_key``: ``{namespace}:{<job key>}``, like its lease key.

    Fences come from the per-namespace Redis counter, so they are only
    comparable within one namespace: the store must never compare a fence of
    one namespace with another's.
    """
    return f"{namespace}:{{{job_key}}}"


def job_key_of(key: str) -> str:
    """Return the job key inside a store key :func:`completion_key` made (else ``key`` itself)."""
    _, brace, rest = key.partition(":{")
    return rest[:-1] if brace and rest.endswith("}") else key


@final
class Completer:
    """One execution's completion: at most one ``complete()``, retried while the lease holds."""

    def __init__(
        self,
        store: CompletionStore,
        held: HeldLease,
        *,
        key: str,
        input_version: str,
        execution_id: str,
        pod: str,
        retry: Backoff = STORE,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        attempt: Attempt | None = None,
        hooks: Hooks = (),
    ) -> None:
        self.store = store
        self._attempt = attempt
        self._hooks = hooks  # the effect hooks: told of every message published
        self.held = held
        self.key = key
        self.input_version = input_version
        self._execution_id = execution_id
        self._pod = pod
        self.retry = retry
        self.max_result_bytes = max_result_bytes
        self.messages: list[Message] = []  # published by the job, committed with the completion
        self.trace: tuple[tuple[str, bytes], ...] = ()  # the trigger's trace context, for them
        self.called = False
        self.result: CompletionResult | None = None
        self.elapsed = 0.0  # the deciding store call's duration
        self.answered_at: float | None = None  # when the store's answer arrived (lease clock)

    async def complete(self, result: object) -> CompletionResult:
        """Record ``result`` with this execution's fence; see the module docstring.

        A result no store can keep raises :class:`~leaseworker.BadResult` first
        (see ``_result_checks``), and does not count as the one call.
        """
        check_result(self.held.key, result, max_bytes=self.max_result_bytes)
        self.begin()
        await anyio.lowlevel.checkpoint_if_cancelled()  # a known loss refuses here
        if self.messages:  # ctx.publish(): the messages commit in the completion's transaction
            return await _transaction.complete_with_messages(self, result)
        fence = self.held.fence
        begun = now()
        retries = Retries(self.retry)  # its sleep is cancelled if the lease is lost meanwhile
        while True:
            try:
                with anyio.CancelScope(shield=True):  # bounded by the store's own timeout
                    answer = await self.store.complete(self.request(result))
            except StoreUnavailable as exc:
                await retries.wait(functools.partial(self.failed, fence, exc))
                await self.held.checkpoint()  # LeaseLost once ownership is uncertain
                continue
            return self.answered(answer, begun)

    def answered(self, answer: CompletionResult, begun: float) -> CompletionResult:
        """Keep the store's answer, when it came and how long the call from ``begun`` took.

        The one place every completion path (``complete``, a transaction's
        commit or its refusal at the start) notes its answer: the history
        recorder places the completion at this moment, not at the release,
        which a paused pod may send long after the store decided.
        """
        self.answered_at = answered_at = now()
        self.elapsed = answered_at - begun
        self.result = answer
        return answer

    def begin(self) -> None:
        """Count the execution's one completion (``complete``, a transaction); raise on a second."""
        if self.called:
            raise RuntimeError(
                f"complete() was already called for execution {self._execution_id} "
                f"of {self.held.key!r}; an execution completes once"
            )
        self.called = True

    def undo(self, mark: int) -> None:
        """Forget a completion that never reached the store, and the messages after ``mark``."""
        del self.messages[mark:]
        self.called = False

    def request(self, result: object) -> CompletionRequest:
        """Return the completion request of ``result`` with this execution's identity and fence.

        It carries what the execution's ``run_in_process`` children cost so far, if it ran any.
        """
        held = self.held
        ran = held.process_calls > 0
        return CompletionRequest(
            job_key=self.key,
            input_version=self.input_version,
            fence=held.fence,
            result=result,
            execution_id=self._execution_id,
            pod=self._pod,
            cpu_seconds=held.cpu_seconds if ran else None,
            peak_memory=held.peak_memory if ran else None,
        )

    def publish(
        self,
        topic: str,
        value: object,
        *,
        key: str | bytes | None = None,
        headers: _transaction.Headers | None = None,
    ) -> str:
        """Add a message to commit with the completion; return its effect id."""
        if self.result is not None:
            raise RuntimeError(f"{self.held.key!r} completed already: publish before completing")
        message = Message.build(topic, value, key=key, headers=headers)
        effect = effect_id(self.key, self.input_version, len(self.messages))
        self.messages.append(dataclasses.replace(message, trace=self._trace_for(topic, effect)))
        return effect

    def _trace_for(self, topic: str, effect: str) -> tuple[tuple[str, bytes], ...]:
        """Tell the hooks of the message; return the trace context it carries.

        A tracing hook writes its ``publish`` span's context into the event's
        carrier: the message then carries this execution's trace. Without one,
        it carries the trigger's (the producer's), as far as there is one.
        """
        if not self._hooks:
            return self.trace
        carrier: list[tuple[str, bytes]] = []
        event = EffectEvent(
            name="published",
            topic=topic,
            effect_id=effect,
            job_key=self.key,
            fence=self.held.fence,
            attempt=self._attempt,
            carrier=carrier,
        )
        emit(self._hooks, event)
        return tuple(carrier) or self.trace

    def transaction(self) -> contextlib.AbstractAsyncContextManager[_transaction.Transaction]:
        """Open the job's transaction; see :func:`._transaction.transaction`."""
        return _transaction.transaction(self)

    def failed(self, fence: int, exc: StoreUnavailable, delay: float, attempt: int) -> None:
        logger.warning(
            "completion of %r (fence %d) failed: %s; retrying in %.2fs (lease held)",
            self.held.key,
            fence,
            exc.detail,
            delay,
            extra={
                "event": "completion_retry",
                "jobId": self.held.key,
                "executionId": self._execution_id,
                "pod": self._pod,
                "fence": fence,
            },
        )

    def own(self, answer: CompletionResult) -> bool:
        """Whether ``answer`` is this execution's own completion (a retried commit that landed)."""
        return answer.status == "accepted" or (
            answer.status == "duplicate"
            and answer.completion is not None
            and answer.completion.execution_id == self._execution_id
        )
