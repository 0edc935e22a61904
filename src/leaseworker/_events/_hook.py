"""``Hook``: the one instrumentation seam, and :func:`emit`, the one way to call hooks.

A hook is any callable taking one event (as stamina's ``RetryHook`` takes
``RetryDetails``, or httpx's ``event_hooks``); components take a tuple of
them. Hooks run inline, in the task of the step they report, and must be
quick; one that raises is logged and skipped, never allowed to change what
happens to a lease, an execution or a record. A hook may say which event
types it wants in an ``accepts`` attribute (a tuple of classes; absent: all):
a component keeps, once, only the hooks for its own events
(:func:`hooks_for`), so a step nobody listens to builds no event.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

from ._effect import EffectEvent
from ._execution import ExecutionEvent
from ._lease import LeaseEvent
from ._source import SourceEvent

logger = logging.getLogger("leaseworker.hooks")

Event = LeaseEvent | ExecutionEvent | SourceEvent | EffectEvent
"""Every event a hook can receive; dispatch on its type (``isinstance``)."""


class Hook(Protocol):
    """Receives every :data:`Event` of the component it is given to; must not block."""

    def __call__(self, event: Event, /) -> None:
        """Handle one event (ignore the kinds it does not know)."""
        ...


Hooks = tuple[Hook, ...]
"""The hooks of one component, called in order."""


def hooks_for(hooks: Iterable[Hook], kind: type[Event]) -> Hooks:
    """Return the hooks that want events of ``kind`` (their ``accepts``, if they say)."""
    return tuple(hook for hook in hooks if kind in getattr(hook, "accepts", (kind,)))


def emit(hooks: Iterable[Hook], event: Event) -> None:
    """Pass ``event`` to every hook in order; a hook's exception is logged and skipped."""
    for hook in hooks:
        try:
            hook(event)
        except Exception:
            logger.exception("hook %r failed on a %s", hook, _name(event))


def _name(event: Event) -> str:
    if isinstance(event, ExecutionEvent):
        return f"{event.event} event"
    return f"{event.name} event"
