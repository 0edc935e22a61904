"""The completion step: record an execution's result through the fenced store.

The input version, the completion key and :class:`Completer`, one execution's
single completion attempt. The store, not the lease, decides whether a late
completion counts, so its call is shielded from the lease's cancellation.
See docs/design.md#the-completion-step.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from typing import final

import anyio

from .._backoff import BusyPolicy
from .._errors import StoreUnavailable
from .._lease import HeldLease, now
from .._retry import STORE, Retries
from .._store import CompletionRequest, CompletionResult, CompletionStore
from ._result import DEFAULT_MAX_RESULT_BYTES, check_result
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
        retry: BusyPolicy = STORE,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    ) -> None:
        self._store = store
        self._held = held
        self.key = key
        self.input_version = input_version
        self._execution_id = execution_id
        self._pod = pod
        self._retry = retry
        self._max_result_bytes = max_result_bytes
        self.called = False
        self.result: CompletionResult | None = None
        self.elapsed = 0.0

    async def complete(self, result: object) -> CompletionResult:
        """Record ``result`` with this execution's fence; see the module docstring.

        A result no store can keep raises :class:`~leaseworker.BadResult` first
        (see ``_result``), and does not count as the one call.
        """
        check_result(self._held.key, result, max_bytes=self._max_result_bytes)
        if self.called:
            raise RuntimeError(
                f"complete() was already called for execution {self._execution_id} "
                f"of {self._held.key!r}; an execution completes once"
            )
        self.called = True
        await anyio.lowlevel.checkpoint_if_cancelled()  # a known loss refuses here
        fence = self._held.fence
        begun = now()
        retries = Retries(self._retry)  # its sleep is cancelled if the lease is lost meanwhile
        while True:
            try:
                with anyio.CancelScope(shield=True):  # bounded by the store's own timeout
                    answer = await self._store.complete(
                        CompletionRequest(
                            job_key=self.key,
                            input_version=self.input_version,
                            fence=fence,
                            result=result,
                            execution_id=self._execution_id,
                            pod=self._pod,
                        )
                    )
            except StoreUnavailable as exc:
                await retries.wait(functools.partial(self._failed, fence, exc))
                await self._held.checkpoint()  # LeaseLost once ownership is uncertain
                continue
            self.elapsed = now() - begun
            self.result = answer
            return answer

    def _failed(self, fence: int, exc: StoreUnavailable, delay: float, attempt: int) -> None:
        logger.warning(
            "completion of %r (fence %d) failed: %s; retrying in %.2fs (lease held)",
            self._held.key,
            fence,
            exc.detail,
            delay,
            extra={
                "event": "completion_retry",
                "jobId": self._held.key,
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
