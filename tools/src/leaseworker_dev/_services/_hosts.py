"""Hosts of their own: network namespaces on one bridge, cut apart by packet filters.

:class:`Hosts` makes a Linux bridge with a private /24 and, per
:meth:`Hosts.add`, a network namespace joined to it by a veth pair, with an
address and ``lo`` up. A service started at a host's :attr:`Host.place` runs in
its namespace (``ip netns exec``) and listens on its address; this process
reaches every host through the bridge's own address (the ``.1``).

Faults are nftables rules inside the namespaces that drop what arrives from a
peer (:meth:`Hosts.cut`, :meth:`Hosts.cut_one_way`, :meth:`Hosts.isolate`), and
a token-bucket rate limit on both ends of a host's veth (:meth:`Hosts.slow`).
Each cut returns its :class:`Drops`, which :meth:`Hosts.mend` removes alone
(faults that overlap heal apart); :meth:`Hosts.heal` removes everything.
Rules, not a link set down: a link down cuts a host from every peer and from
this process at once, cannot cut one direction, and fails connects at once
("network unreachable"), where a partition makes the peer hear nothing and
time out. Drops are on input: a drop on output fails the sender's own send at
once (``EPERM``), which no network does.

Each :class:`Hosts` takes a number ``n`` (0 to 255) and with it the subnet
198.18.n.0/24 (RFC 2544's benchmarking block, which real networks do not
route; a subnet the machine already reaches is skipped) and the names
``lwh<n>`` (the bridge), ``lwh<n>v<k>`` (veth ends) and ``lwh<n>-<host>``
(namespaces), so two runs or two pytest workers never share one. The number
is held by a lock on byte ``n`` of :data:`HOSTS_LOCK`, which the kernel drops
when the process ends, however it ends: anything named after a number nobody
holds belongs to a crashed run and is removed by the next :meth:`Hosts.create`.
See docs/design.md#development-services.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Self, TypeVar, final

from ._byte_locks import ByteLocks
from ._proc import Place

T = TypeVar("T")
Reach = Literal["open", "refused", "silent"]
"""What a TCP connect found: a listener, a refusal (nothing listens), or no answer at all."""

HOSTS_LOCK = Path("/tmp/leaseworker-hosts.lock")
"""The file whose byte ``n`` a process locks (:class:`ByteLocks`) while it owns hosts ``n``."""

_NAME = re.compile(r"[a-z][a-z0-9-]{0,19}")
_OUR_LINK = re.compile(r"lwh(\d{1,3})(?:v\d+)?")
_OUR_NAMESPACE = re.compile(r"lwh(\d{1,3})-.+")
_PROBE = re.compile(r"lwhprobe-(\d+)")
_RATE = re.compile(r"\d+(?:kbit|mbit)")
_HANDLE = re.compile(r"# handle (\d+)")
_TABLE = (
    "table inet lwh {\n chain input {\n type filter hook input priority 0; policy accept;\n }\n}\n"
)
_CLONE_NEWNET = 0x40000000
_SUBNETS = 256


@final
@dataclass(frozen=True, slots=True)
class Host:
    """One namespace on the bridge: its name, namespace, address and veth end outside it."""

    name: str
    namespace: str
    address: str
    veth: str

    @property
    def place(self) -> Place:
        """Where a service runs in this namespace, listening on its address."""
        return Place(self.address, ("ip", "netns", "exec", self.namespace))


@final
@dataclass(frozen=True, slots=True)
class Drops:
    """The drop rules one cut added: (host name, nftables rule handle) each; :meth:`Hosts.mend`."""

    rules: tuple[tuple[str, int], ...] = ()

    def __add__(self, other: Drops) -> Drops:
        return Drops(self.rules + other.rules)


@final
class Hosts:
    """A bridge and the hosts on it; faults between them; everything removed by :meth:`close`.

    Use as a context manager (``with Hosts.create() as hosts:``). Every method
    blocks for a few ``ip``/``nft``/``tc`` runs (milliseconds each).
    """

    def __init__(self, number: int) -> None:
        """Own the hosts numbered ``number`` (its lock is held): use :meth:`create`."""
        self.number = number
        self.bridge = f"lwh{number}"
        self.bridge_address = f"198.18.{number}.1"
        self.hosts: dict[str, Host] = {}
        self._slowed: set[str] = set()
        self._closed = False

    @staticmethod
    def available() -> str | None:
        """Return why namespaces cannot be made here (one line), or ``None`` if they can."""
        if os.geteuid() != 0:
            return "network namespaces need root (ip netns add)"
        missing = [tool for tool in ("ip", "nft", "tc") if shutil.which(tool) is None]
        if missing:
            return f"{' and '.join(missing)} not installed (iproute2, nftables)"
        probe = f"lwhprobe-{os.getpid()}"
        try:
            _run("ip", "netns", "add", probe)
        except RuntimeError as exc:
            return f"cannot make a network namespace: {exc}"
        with contextlib.suppress(RuntimeError):
            _run("ip", "netns", "del", probe)
        return None

    @classmethod
    def create(cls) -> Self:
        """Remove a crashed run's leftovers, take a free number, and make its bridge."""
        _sweep()
        for number in _candidates():
            if not _LOCKS.take(number):
                continue
            _remove(number)  # a crashed run's, of this very number
            if not _subnet_free(number):
                _LOCKS.give_back(number)
                continue
            hosts = cls(number)
            try:
                hosts._make_bridge()
            except BaseException:
                hosts.close()
                raise
            return hosts
        raise RuntimeError("no free 198.18.n.0/24 subnet for the test hosts")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def at(self, address: str) -> Host:
        """Return the host whose address is ``address`` (a service's listening address)."""
        return next(host for host in self.hosts.values() if host.address == address)

    # -- building

    def add(self, name: str) -> Host:
        """Make host ``name``: a namespace, a veth on the bridge, the next address, lo up."""
        if not _NAME.fullmatch(name):
            raise ValueError(f"host name {name!r}: lower-case letters, digits and '-', at most 20")
        if name in self.hosts:
            raise ValueError(f"host {name!r} exists already")
        index = len(self.hosts) + 2  # .1 is the bridge
        if index > 254:
            raise ValueError("a /24 holds at most 253 hosts")
        host = Host(
            name=name,
            namespace=f"{self.bridge}-{name}",
            address=f"198.18.{self.number}.{index}",
            veth=f"{self.bridge}v{index}",
        )
        self.hosts[name] = host
        _run("ip", "netns", "add", host.namespace)
        _run(
            "ip", "link", "add", host.veth, "type", "veth", "peer", "eth0", "netns", host.namespace
        )
        _run("ip", "link", "set", host.veth, "master", self.bridge, "up")
        inside = ("ip", "-n", host.namespace)
        _run(*inside, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _run(*inside, "link", "set", "eth0", "up")
        _run(*inside, "link", "set", "lo", "up")
        _nft(host, _TABLE)
        return host

    # -- faults

    def cut(self, a: Host, b: Host) -> Drops:
        """Drop every packet between ``a`` and ``b``, both ways; each still reaches the others."""
        return self.cut_one_way(a, b) + self.cut_one_way(b, a)

    def cut_one_way(self, source: Host, destination: Host) -> Drops:
        """Drop what ``source`` sends ``destination``; the other way still flows.

        TCP needs both ways, so a connection either way stalls (its segments or
        its acknowledgements are lost); what differs is who hears whom.
        """
        return _drop(destination, f"ip saddr {source.address}")

    def isolate(self, host: Host) -> Drops:
        """Cut ``host`` from every other host and from this process, both ways."""
        drops = _drop(host, 'iifname "eth0"')
        for other in self.hosts.values():
            if other is not host:
                drops += self.cut_one_way(host, other)
        return drops

    def mend(self, drops: Drops) -> None:
        """Remove the rules of one cut (what :meth:`cut` and the others returned), only those.

        A rule gone already (:meth:`heal`, or mended before) is skipped.
        """
        for name, handle in drops.rules:
            host = self.hosts.get(name)
            if host is not None:
                with contextlib.suppress(RuntimeError):
                    _nft(host, f"delete rule inet lwh input handle {handle}")

    def slow(self, host: Host, rate: str) -> None:
        """Limit ``host``'s link to ``rate`` (``"400kbit"``, ``"2mbit"``) each way (tbf)."""
        if not _RATE.fullmatch(rate):
            raise ValueError(f"rate {rate!r}: a number of kbit or mbit, such as 400kbit")
        tbf = ("root", "tbf", "rate", rate, "burst", "16kb", "latency", "2s")
        _run("ip", "netns", "exec", host.namespace, "tc", "qdisc", "replace", "dev", "eth0", *tbf)
        _run("tc", "qdisc", "replace", "dev", host.veth, *tbf)
        self._slowed.add(host.name)

    def heal(self) -> None:
        """Remove every drop rule and rate limit: all hosts reach each other again."""
        for host in self.hosts.values():
            _nft(host, "flush chain inet lwh input")
        for name in sorted(self._slowed):
            host = self.hosts[name]
            _run("ip", "netns", "exec", host.namespace, "tc", "qdisc", "del", "dev", "eth0", "root")
            _run("tc", "qdisc", "del", "dev", host.veth, "root")
        self._slowed.clear()

    # -- measuring

    def reach(self, source: Host | None, destination: Host, port: int, timeout: float) -> Reach:
        """Connect over TCP from ``source`` (``None``: this process) to ``destination:port``."""

        def connect() -> Reach:
            try:
                with socket.create_connection((destination.address, port), timeout):
                    return "open"
            except ConnectionRefusedError:
                return "refused"
            except OSError:  # a timeout, or unreachable
                return "silent"

        return connect() if source is None else in_namespace(source, connect)

    def listener(self, host: Host, port: int = 0) -> socket.socket:
        """Return a socket listening on ``host``'s address, in its namespace (close it)."""

        def listen() -> socket.socket:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind((host.address, port))
                sock.listen()
            except BaseException:
                sock.close()
                raise
            return sock

        return in_namespace(host, listen)

    # -- teardown

    def close(self) -> None:
        """Remove every namespace (ending what still runs in it), veth and the bridge.

        Rules and rate limits live inside the namespaces and on the veth ends:
        they go with them. Safe to call twice.
        """
        if self._closed:
            return
        self._closed = True
        try:
            _remove(self.number)
        finally:
            self.hosts.clear()
            _LOCKS.give_back(self.number)

    def _make_bridge(self) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")


def in_namespace(host: Host, work: Callable[[], T]) -> T:
    """Run ``work`` on a fresh thread that entered ``host``'s network namespace; return its result.

    Sockets it creates stay in that namespace after the thread ends.
    """
    results: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fd = os.open(f"/run/netns/{host.namespace}", os.O_RDONLY)
            try:
                if _LIBC.setns(fd, _CLONE_NEWNET) != 0:
                    code = ctypes.get_errno()
                    raise OSError(code, f"setns into {host.namespace}: {os.strerror(code)}")
            finally:
                os.close(fd)
            results.append(work())
        except BaseException as exc:  # handed to the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=run, name=f"in-{host.namespace}")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return results[0]


_LIBC = ctypes.CDLL(None, use_errno=True)


def _run(*argv: str, given: str | None = None) -> str:
    """Run one ``ip``/``nft``/``tc`` command; return its output or raise one line saying why."""
    done = subprocess.run(
        argv, input=given, check=False, capture_output=True, text=True, timeout=30
    )
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise RuntimeError(f"{' '.join(argv)}: {said[-1] if said else done.returncode}")
    return done.stdout


def _nft(host: Host, rules: str) -> None:
    """Apply nftables ``rules`` inside ``host``'s namespace."""
    _run("ip", "netns", "exec", host.namespace, "nft", "-f", "-", given=rules)


def _drop(host: Host, match: str) -> Drops:
    """Add a rule dropping what ``match`` matches on ``host``'s input; return it by its handle."""
    rule = f"add rule inet lwh input {match} drop"
    echoed = _run("ip", "netns", "exec", host.namespace, "nft", "-e", "-a", "-f", "-", given=rule)
    found = _HANDLE.search(echoed)
    if found is None:
        raise RuntimeError(f"nft did not echo the handle of {rule!r}: {echoed.strip()!r}")
    return Drops(((host.name, int(found[1])),))


def _candidates() -> Iterator[int]:
    start = random.SystemRandom().randrange(_SUBNETS)
    yield from range(start, _SUBNETS)
    yield from range(start)


def _subnet_free(number: int) -> bool:
    """Whether this machine has no address or route in 198.18.``number``.0/24 already."""
    subnet = ipaddress.ip_network(f"198.18.{number}.0/24")
    routes = json.loads(_run("ip", "-j", "-4", "route", "show", "table", "all") or "[]")
    for route in routes:
        destination = route.get("dst", "default")
        if destination == "default":
            continue
        with contextlib.suppress(ValueError):
            if ipaddress.ip_network(destination, strict=False).overlaps(subnet):
                return False
    return True


def _sweep() -> None:
    """Remove the namespaces, veths and bridges of numbers no live process holds."""
    numbers = {int(m[1]) for m in map(_OUR_NAMESPACE.fullmatch, _namespaces()) if m}
    numbers |= {int(m[1]) for m in map(_OUR_LINK.fullmatch, _links()) if m}
    for namespace in _namespaces():  # a probe of a process killed in available()
        if (m := _PROBE.fullmatch(namespace)) and not _alive(int(m[1])):
            _run("ip", "netns", "del", namespace)
    for number in sorted(numbers):
        if _LOCKS.take(number):
            try:
                _remove(number)
            finally:
                _LOCKS.give_back(number)


def _remove(number: int) -> None:
    """Remove everything named after ``number``: processes in its namespaces, namespaces, links."""
    prefix = f"lwh{number}"
    for namespace in _namespaces():
        if (m := _OUR_NAMESPACE.fullmatch(namespace)) and int(m[1]) == number:
            for pid in _run("ip", "netns", "pids", namespace).split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            _run("ip", "netns", "del", namespace)
    links = [name for name in _links() if (m := _OUR_LINK.fullmatch(name)) and int(m[1]) == number]
    for link in sorted(links, key=lambda name: name == prefix):  # the bridge last
        with contextlib.suppress(RuntimeError):  # a veth goes with its namespace, maybe just now
            _run("ip", "link", "del", link)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _run("ip", "netns", "list").splitlines() if line.strip()]


def _links() -> list[str]:
    return [link["ifname"] for link in json.loads(_run("ip", "-j", "link", "show") or "[]")]


_LOCKS = ByteLocks(HOSTS_LOCK, 0o600)
