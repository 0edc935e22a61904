"""``memory://``: the completion store in this process's memory, for tests and demos.

``_memory_store``: :class:`MemoryStore`, the ``CompletionStore``;
``_memory_effects``: its transactions and outbox (the durable stores' rules).
"""

from ._memory_store import MemoryStore as MemoryStore

__all__ = ["MemoryStore"]
