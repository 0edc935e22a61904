"""The event family and the one hook protocol every box reports through.

``_identity`` who an event is about (``Trigger``, ``Attempt``); ``_lease``
the held lease's steps (``LeaseEvent``); ``_execution`` how executions end
(``Ending``) and their steps (``ExecutionEvent``); ``_source`` the Kafka
source's steps (``SourceEvent``); ``_effect`` what happens to a job's
messages (``EffectEvent``: published, relayed, received); ``_hook`` the ``Hook`` protocol and
``emit()``. Low in the layers so ``_lease``, ``_execution`` and ``_kafka``
all report through it; telemetry, logs, the history recorder and the testing
kit subscribe as hooks.
"""

from ._effect import EffectEvent as EffectEvent
from ._effect import EffectEventName as EffectEventName
from ._execution import LOSS_REASONS as LOSS_REASONS
from ._execution import Ending as Ending
from ._execution import ExecutionEvent as ExecutionEvent
from ._execution import ExecutionEventName as ExecutionEventName
from ._execution import Reason as Reason
from ._hook import Event as Event
from ._hook import Hook as Hook
from ._hook import Hooks as Hooks
from ._hook import emit as emit
from ._hook import hooks_for as hooks_for
from ._identity import Attempt as Attempt
from ._identity import Trigger as Trigger
from ._lease import LeaseEvent as LeaseEvent
from ._lease import LeaseEventName as LeaseEventName
from ._source import SourceEvent as SourceEvent
from ._source import SourceEventName as SourceEventName

__all__ = [
    "LOSS_REASONS",
    "Attempt",
    "EffectEvent",
    "EffectEventName",
    "Ending",
    "Event",
    "ExecutionEvent",
    "ExecutionEventName",
    "Hook",
    "Hooks",
    "LeaseEvent",
    "LeaseEventName",
    "Reason",
    "SourceEvent",
    "SourceEventName",
    "Trigger",
    "emit",
    "hooks_for",
]
