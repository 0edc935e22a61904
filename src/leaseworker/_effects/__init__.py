"""Effects after the commit: the outbox relay and the receivers' inbox.

``_relay`` sends committed outbox rows through a ``Sender`` (Kafka's is
``leaseworker._kafka.KafkaSender``), in commit order per job key, marking
sent only what the broker acknowledged; ``_inbox`` the receivers' idempotent
inbox (PostgreSQL, SQLite, memory) that drops duplicate and stale effects.
The public names are in :mod:`leaseworker.effects`. Knows no aiokafka.
"""

from ._inbox import Effect as Effect
from ._inbox import EffectStatus as EffectStatus
from ._inbox import MemoryInbox as MemoryInbox
from ._inbox import PostgresInbox as PostgresInbox
from ._inbox import SqliteInbox as SqliteInbox
from ._relay import CLAIM_HOLD as CLAIM_HOLD
from ._relay import Relay as Relay
from ._relay import Sender as Sender

__all__ = [
    "CLAIM_HOLD",
    "Effect",
    "EffectStatus",
    "MemoryInbox",
    "PostgresInbox",
    "Relay",
    "Sender",
    "SqliteInbox",
]
