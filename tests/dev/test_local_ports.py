"""free_port(): loopback ports for the services the suite starts (no service needed)."""

from __future__ import annotations

import socket

from leaseworker_dev._services import free_port
from leaseworker_dev._services._proc import LOOPBACK, _ephemeral_low


def test_free_ports_come_from_below_the_ephemeral_range_and_can_be_bound() -> None:
    """A chosen port is never one the kernel could hand to an outgoing connection.

    A service binds its port seconds after it was chosen (a JVM starting): a
    port from the ephemeral range could meanwhile become the local port of one
    of the suite's own client connections, and the service would not start.
    """
    low = _ephemeral_low()
    ports = [free_port() for _ in range(50)]
    if low > 21000:  # Linux's default range starts at 32768
        assert all(20000 <= port < low for port in ports)
    assert len(set(ports)) > 40  # spread over the range, not one port again and again
    with socket.socket() as sock:
        sock.bind((LOOPBACK, ports[-1]))
