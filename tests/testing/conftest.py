"""Every async test here runs on virtual time (the recipe docs/testing.md gives users).

Except those of the plugin's embedded pod (``leaseworker_pod``): it talks to a real
Redis and Kafka, which answer in real time; on a virtual clock the pod's first PING
timed out at once (the loop, idle on the socket, jumped to the timeout).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest

from leaseworker.testing import VirtualTimeLoop


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Pick each async test's loop here (pytest-asyncio >= 1.5): virtual, or real for a pod."""
    if "leaseworker_pod" in getattr(item, "fixturenames", ()):
        return {"real_time": asyncio.new_event_loop}
    return {"virtual_time": VirtualTimeLoop}
