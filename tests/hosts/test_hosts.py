"""The hosts builder: what cut, cut_one_way, isolate, mend, slow and heal do, by TCP connects.

Each fault is measured from one namespace to another with a real connect to
a listener, so a rule that dropped nothing (or everything) fails here.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from leaseworker_dev._services import Host, Hosts
from leaseworker_dev._services._hosts import in_namespace

WAIT = 0.3
"""Seconds a connect may take before the peer counts as silent (a bridge answers in µs)."""


@pytest.fixture(scope="module")
def trio(hosts: Hosts) -> tuple[Host, Host, Host]:
    """Three hosts, a, b and c."""
    return hosts.add("a"), hosts.add("b"), hosts.add("c")


@pytest.fixture
def listening(hosts: Hosts, trio: tuple[Host, Host, Host]) -> Iterator[dict[str, int]]:
    """A listener on each of the three hosts (name -> port); healed after the test."""
    sockets = {host.name: hosts.listener(host) for host in trio}
    try:
        yield {name: sock.getsockname()[1] for name, sock in sockets.items()}
    finally:
        hosts.heal()
        for sock in sockets.values():
            sock.close()


def reach(hosts: Hosts, ports: dict[str, int], source: Host | None, destination: Host) -> str:
    """What a connect from ``source`` to ``destination``'s listener finds."""
    return hosts.reach(source, destination, ports[destination.name], WAIT)


def test_hosts_reach_each_other_and_this_process_reaches_them(
    hosts: Hosts, trio: tuple[Host, Host, Host], listening: dict[str, int]
) -> None:
    """Every pair connects both ways; a port nobody listens on is refused, not silent."""
    for source in trio:
        for destination in trio:
            if source is not destination:
                assert reach(hosts, listening, source, destination) == "open"
        assert reach(hosts, listening, None, source) == "open"
    a, b, _c = trio
    assert hosts.reach(a, b, listening["b"] + 1, WAIT) == "refused"


def test_cut_drops_both_ways_between_two_hosts_only(
    hosts: Hosts, trio: tuple[Host, Host, Host], listening: dict[str, int]
) -> None:
    """After cut(a, b) neither hears the other (silence, not a refusal); c reaches both; heal."""
    a, b, c = trio
    hosts.cut(a, b)
    assert reach(hosts, listening, a, b) == "silent"
    assert reach(hosts, listening, b, a) == "silent"
    assert {reach(hosts, listening, c, a), reach(hosts, listening, c, b)} == {"open"}
    assert {reach(hosts, listening, a, c), reach(hosts, listening, b, c)} == {"open"}
    hosts.heal()
    assert reach(hosts, listening, a, b) == "open"
    assert reach(hosts, listening, b, a) == "open"


def test_cut_one_way_loses_one_direction(
    hosts: Hosts, trio: tuple[Host, Host, Host], listening: dict[str, int]
) -> None:
    """cut_one_way(a, b): b never hears a; a's datagrams to b are lost, b's to a arrive."""
    a, b, _c = trio
    hosts.cut_one_way(a, b)
    # TCP needs both ways, so a connect either way stalls; datagrams show the direction.
    assert reach(hosts, listening, a, b) == "silent"
    assert reach(hosts, listening, b, a) == "silent"
    assert not _datagram_arrives(a, b)
    assert _datagram_arrives(b, a)
    hosts.heal()
    assert _datagram_arrives(a, b)


def test_isolate_cuts_a_host_from_every_host_and_this_process(
    hosts: Hosts, trio: tuple[Host, Host, Host], listening: dict[str, int]
) -> None:
    """isolate(a): a reaches nobody, nobody reaches a (this process neither); b and c talk."""
    a, b, c = trio
    hosts.isolate(a)
    for other in (b, c):
        assert reach(hosts, listening, a, other) == "silent"
        assert reach(hosts, listening, other, a) == "silent"
    assert reach(hosts, listening, None, a) == "silent"
    assert reach(hosts, listening, b, c) == "open"
    hosts.heal()
    assert reach(hosts, listening, b, a) == "open"


def test_mend_removes_one_cut_and_leaves_the_others(
    hosts: Hosts, trio: tuple[Host, Host, Host], listening: dict[str, int]
) -> None:
    """cut(a, b) and isolate(c); mending the cut reconnects a and b, c stays cut off; then c."""
    a, b, c = trio
    cut = hosts.cut(a, b)
    isolated = hosts.isolate(c)
    hosts.mend(cut)
    assert reach(hosts, listening, a, b) == "open"
    assert reach(hosts, listening, b, a) == "open"
    assert reach(hosts, listening, a, c) == "silent"
    assert reach(hosts, listening, c, b) == "silent"
    assert reach(hosts, listening, None, c) == "silent"
    hosts.mend(cut)  # mended already: nothing left to remove
    hosts.mend(isolated)
    assert reach(hosts, listening, a, c) == "open"
    assert reach(hosts, listening, None, c) == "open"


def test_slow_limits_the_rate_of_a_link(
    hosts: Hosts, trio: tuple[Host, Host, Host], listening: dict[str, int]
) -> None:
    """At 400 kbit/s, 100 kB take at least 1.5 s (8e5 bits less a 16 kB burst); healed, far less."""
    a, b, _c = trio
    size = 100_000
    hosts.slow(a, "400kbit")
    slowed = _send(a, b, size)
    hosts.heal()
    healed = _send(a, b, size)
    assert slowed >= (size - 16_384) * 8 / 400_000, slowed
    assert healed < slowed / 5, (healed, slowed)


def test_a_crashed_runs_leftovers_are_removed_by_the_next_start() -> None:
    """A child makes hosts and dies by SIGKILL; the next Hosts.create() removes what it left."""
    script = (
        "import os, signal\n"
        "from leaseworker_dev._services import Hosts\n"
        "hosts = Hosts.create(); hosts.add('left')\n"
        "print(hosts.bridge, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    bridge = done.stdout.strip()
    assert bridge.startswith("lwh"), done.stderr
    assert f"{bridge}-left" in _ip("netns", "list")  # left behind by the kill
    with Hosts.create():
        assert f"{bridge}-left" not in _ip("netns", "list")
        assert bridge not in _links()


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def _links() -> list[str]:
    return [line.split(":")[1].strip().split("@")[0] for line in _ip("-o", "link").splitlines()]


def _datagram_arrives(source: Host, destination: Host) -> bool:
    """Send one UDP datagram from ``source`` to ``destination``; whether it arrived within WAIT."""
    receiver = in_namespace(destination, lambda: _udp(destination.address))
    with receiver:
        port = receiver.getsockname()[1]
        sender = in_namespace(source, lambda: _udp(source.address))
        with sender:
            sender.sendto(b"x", (destination.address, port))
        receiver.settimeout(WAIT)
        try:
            return receiver.recv(1) == b"x"
        except TimeoutError:
            return False


def _udp(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((address, 0))
    return sock


def _send(source: Host, destination: Host, size: int) -> float:
    """Seconds from connect to the peer's receipt of ``size`` bytes sent from ``source``."""
    server = in_namespace(destination, lambda: _tcp_listener(destination.address))
    with server:
        port = server.getsockname()[1]
        client = in_namespace(
            source, lambda: socket.create_connection((destination.address, port), 5)
        )
        with client:
            peer, _ = server.accept()
            with peer:
                began = time.monotonic()
                client.sendall(b"\0" * size)
                peer.settimeout(30)
                got = 0
                while got < size:
                    got += len(peer.recv(65536))
                return time.monotonic() - began


def _tcp_listener(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((address, 0))
    sock.listen()
    return sock


def test_without_root_the_probe_says_why_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hosts.available() names what is missing (the line tests/hosts skip with); root: None."""
    if Hosts.available() is not None:
        pytest.skip("namespaces cannot be made here at all")
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert Hosts.available() == "network namespaces need root (ip netns add)"


def test_a_failure_inside_leaves_nothing_behind() -> None:
    """An error while hosts are cut and slowed: leaving the block removes namespaces and links."""
    with pytest.raises(RuntimeError, match="the test failed"), Hosts.create() as made:
        a, b = made.add("a"), made.add("b")
        made.cut(a, b)
        made.slow(a, "1mbit")
        raise RuntimeError("the test failed")
    assert not [name for name in _ip("netns", "list").split() if name.startswith(f"{made.bridge}-")]
    ours = [link for link in _links() if link == made.bridge or link.startswith(f"{made.bridge}v")]
    assert not ours
