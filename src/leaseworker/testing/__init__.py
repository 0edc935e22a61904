"""Test helpers shipped with leaseworker, for its own tests and for yours.

``ChaosProxy`` sits between a client and a real server and can black-hole,
delay or cut the traffic, to reproduce an unreachable or slow Redis.
"""

from ._chaos import ChaosProxy as ChaosProxy

__all__ = ["ChaosProxy"]
