"""One store lookup shared by the triggers of a poll, made before any takes its lease.

:class:`Lookup` asks ``lookup_many`` once for all its identities, when the
first of its executions needs an answer; the others take theirs from it (with
the memory or an idle SQLite store the answer is there before they ask). A
single trigger, or a retried execution, is a lookup of one.
See docs/completion.md#what-the-worker-does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import final

import anyio

from .._errors import StoreUnavailable
from .._store import Completion, CompletionStore


@final
class Lookup:
    """The completions of ``identities`` (``(completion key, input version)``), asked once.

    If the execution asking is cancelled before the answer, the next one to
    ask asks again; a :class:`StoreUnavailable` is every identity's answer.
    """

    def __init__(self, store: CompletionStore, identities: Sequence[tuple[str, str]]) -> None:
        self._store = store
        self._identities = identities
        self._answers: list[Completion | None] | None = None
        self._error: StoreUnavailable | None = None
        self._asking = False
        self._asked: anyio.Event | None = None  # made only when a second one waits

    async def answer(self, index: int) -> Completion | None:
        """Return the completion of identity ``index`` (``None``: it never completed)."""
        while self._answers is None and self._error is None:
            if self._asking:
                if self._asked is None:
                    self._asked = anyio.Event()
                await self._asked.wait()
                continue
            self._asking = True
            try:
                self._answers = await self._store.lookup_many(self._identities)
            except StoreUnavailable as exc:
                self._error = exc
            finally:
                self._asking = False
                asked, self._asked = self._asked, None
                if asked is not None:
                    asked.set()
        if self._error is not None:
            error = StoreUnavailable(self._identities[index][0], self._error.detail)
            error.__cause__ = self._error.__cause__
            raise error
        assert self._answers is not None
        return self._answers[index]
