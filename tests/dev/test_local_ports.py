"""free_port(): loopback ports for the services the suite starts, reserved (no service needed)."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
from pathlib import Path

from leaseworker_dev._services import free_port
from leaseworker_dev._services._byte_locks import ByteLocks
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


PICKER = """
import json, random, sys, threading
from leaseworker_dev._services import _proc

# Every picker draws the same candidates: only the reservations can keep them apart.
_proc._RANDOM = random.Random(48)
print("ready", flush=True)
sys.stdin.readline()
picked = []
threads = [
    threading.Thread(target=lambda: picked.extend(_proc.distinct_free_ports(5))) for _ in range(4)
]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps(picked), flush=True)
sys.stdin.read()  # the reservations last while this process does: until every picker reported
"""


def test_concurrent_pickers_in_several_processes_never_get_the_same_port() -> None:
    """Five processes of four threads each pick ports at once: no port is handed out twice.

    The pickers are forced to try the same ports in the same order (one seed),
    as two pickers do by chance: with a port only checked by binding and closing
    it, they would all return the first one.
    """
    with contextlib.ExitStack() as stack:  # each picker's exit: stdin closed, process waited for
        pickers = [
            stack.enter_context(
                subprocess.Popen(
                    [sys.executable, "-c", PICKER],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
            for _ in range(5)
        ]
        for picker in pickers:
            assert picker.stdout is not None
            assert picker.stdout.readline() == "ready\n"
        for picker in pickers:
            assert picker.stdin is not None
            picker.stdin.write("go\n")
            picker.stdin.flush()
        picked = [json.loads(picker.stdout.readline()) for picker in pickers if picker.stdout]
    ports = [port for each in picked for port in each]
    assert len(ports) == 5 * 4 * 5
    assert len(set(ports)) == len(ports), sorted(ports)


HOLDER = """
import sys
from pathlib import Path
from leaseworker_dev._services._byte_locks import ByteLocks

locks = ByteLocks(Path(sys.argv[1]), 0o600)
print(locks.take(int(sys.argv[2])), flush=True)
sys.stdin.readline()  # holds until told to exit
"""


def _holder(path: Path, number: int) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), str(number)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline() == "True\n"
    return holder


def _exit(holder: subprocess.Popen[str]) -> None:
    holder.communicate("exit\n", timeout=30)
    assert holder.returncode == 0


def test_the_lock_file_is_removed_by_the_last_holder_to_exit(tmp_path: Path) -> None:
    """Reservations leave nothing behind: the file goes with the last process holding a byte."""
    path = tmp_path / "reservations.lock"
    first, second = _holder(path, 7), _holder(path, 9)
    _exit(first)
    assert path.exists()  # the second still holds byte 9
    _exit(second)
    assert not path.exists()


def test_a_take_on_a_file_removed_meanwhile_starts_over_on_a_new_file(tmp_path: Path) -> None:
    """A lock on a removed file reserves nothing: the taker notices and locks the new file.

    This process opened the file, then its last other holder removed it (as at
    that holder's exit): the byte locked next must be locked where other
    processes look, so a second process is refused the same number.
    """
    path = tmp_path / "reservations.lock"
    locks = ByteLocks(path, 0o600)
    assert locks.take(3)
    locks.give_back(3)
    path.unlink()  # what the last other holder's exit does
    assert locks.take(5)
    assert path.exists()
    taker = subprocess.run(
        [sys.executable, "-c", HOLDER, str(path), "5"],
        input="exit\n",
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert taker.stdout == "False\n"
    locks.remove_if_unused()
    assert not path.exists()
