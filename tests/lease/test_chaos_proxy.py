"""ChaosProxy, the fault-injecting proxy users test their own jobs with (loopback only)."""

from __future__ import annotations

import anyio
import pytest

from leaseworker.testing import ChaosProxy
from leaseworker_dev._services import free_port


async def test_an_upstream_that_refuses_closes_the_client_and_leaves_the_proxy_running() -> None:
    """A really stopped server: the client sees its link closed; the proxy's block goes on.

    The refused upstream connection used to raise inside the proxy's listener
    and cancel the user's ``async with ChaosProxy(...)`` body with an
    ExceptionGroup.
    """
    async with ChaosProxy(free_port()) as proxy:  # nothing listens upstream
        for _ in range(2):  # and again: the proxy still accepts
            with anyio.fail_after(5):
                stream = await anyio.connect_tcp("127.0.0.1", proxy.port)
                async with stream:
                    with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                        await stream.receive()
