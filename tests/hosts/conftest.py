"""The hosts of this directory's tests: network namespaces on a bridge, or a skip saying why."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from leaseworker_dev._services import Hosts


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    """A bridge of the module's own; each test adds hosts and ends healed.

    Skips (one line: not root, no ``ip``, no namespace) where namespaces cannot be made.
    """
    reason = Hosts.available()
    if reason is not None:
        pytest.skip(reason)
    with Hosts.create() as made:
        yield made
