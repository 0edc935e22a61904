"""Effects that commit with the completion, and receivers that drop duplicates and stale ones.

A job writes its rows and publishes its messages in the completion's
transaction (``ctx.transaction()``, ``ctx.publish()``: see
:class:`Transaction`); a relay in every pod sends committed messages to
Kafka with the headers ``leaseworker-effect-id``, ``leaseworker-job-key``
and ``leaseworker-fence``; a receiver records each effect in its own
transaction through an inbox (:class:`PostgresInbox`, :class:`SqliteInbox`,
:class:`MemoryInbox`) and processes only the ``new`` ones. Each step is an
:class:`EffectEvent` for hooks (a pod's telemetry makes its spans and
metrics). See docs/effects.md.
"""

from ._effects import Effect as Effect
from ._effects import EffectStatus as EffectStatus
from ._effects import MemoryInbox as MemoryInbox
from ._effects import PostgresInbox as PostgresInbox
from ._effects import Relay as Relay
from ._effects import Sender as Sender
from ._effects import SqliteInbox as SqliteInbox
from ._errors import TransactionRefused as TransactionRefused
from ._events import EffectEvent as EffectEvent
from ._execution import Transaction as Transaction
from ._store import EFFECT_ID_HEADER as EFFECT_ID_HEADER
from ._store import FENCE_HEADER as FENCE_HEADER
from ._store import JOB_KEY_HEADER as JOB_KEY_HEADER
from ._store import OutboxRow as OutboxRow
from ._store import effect_id as effect_id

__all__ = [
    "EFFECT_ID_HEADER",
    "FENCE_HEADER",
    "JOB_KEY_HEADER",
    "Effect",
    "EffectEvent",
    "EffectStatus",
    "MemoryInbox",
    "OutboxRow",
    "PostgresInbox",
    "Relay",
    "Sender",
    "SqliteInbox",
    "Transaction",
    "TransactionRefused",
    "effect_id",
]

for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) and _obj.__module__.startswith("leaseworker._"):
        _obj.__module__ = "leaseworker.effects"  # reprs and docs show the public path
del _name, _obj
