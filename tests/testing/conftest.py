"""Every async test here runs on virtual time (the recipe docs/testing.md gives users)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest

from leaseworker.testing import VirtualTimeLoop


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], VirtualTimeLoop]]:
    """Run this directory's async tests on a :class:`VirtualTimeLoop` (pytest-asyncio >= 1.5)."""
    return {"virtual_time": VirtualTimeLoop}
