"""Functions the process pool's tests run in a child (importable, so they pickle).

The ones that block tell the test where they are through marker files: a file
appears (written whole, then renamed) when the child reached that point.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import signal
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import Final

from leaseworker import ProcessContext


def mark(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (the test waits for the file)."""
    temporary = f"{path}.part"
    Path(temporary).write_text(text)
    os.rename(temporary, path)


def add(pctx: ProcessContext, a: int, b: int) -> int:
    """Return ``a + b``."""
    return a + b


def identity(pctx: ProcessContext) -> tuple[str, str, int, int]:
    """The call's identity as the child sees it, and the child's pid."""
    return pctx.job_key, pctx.execution_id, pctx.fence, os.getpid()


def fail(pctx: ProcessContext, message: str) -> None:
    """Raise ``ValueError(message)``."""
    raise ValueError(message)


class OddError(Exception):
    """An exception that pickles but cannot be rebuilt (its __init__ wants two arguments)."""

    def __init__(self, first: str, second: str) -> None:
        super().__init__(f"{first}/{second}")


def fail_oddly(pctx: ProcessContext) -> None:
    """Raise an exception that cannot cross back to the pod as itself."""
    raise OddError("a", "b")


def segfault(pctx: ProcessContext) -> None:
    """Read address 0: SIGSEGV."""
    ctypes.string_at(0)


def exit_now(pctx: ProcessContext, code: int) -> None:
    """Leave the child at once with ``code``."""
    os._exit(code)


STAMP: Final = struct.Struct("d")


def last_stamp(marker: str | Path) -> float:
    """The ``time.monotonic()`` that ``spin_with_grandchild`` last wrote: its last loop's."""
    return float(STAMP.unpack(Path(f"{marker}.stamp").read_bytes())[0])


def spin_with_grandchild(pctx: ProcessContext, marker: str) -> None:
    """Start a sleeping grandchild, mark "child grandchild" pids, then compute forever.

    Every turn of the loop writes ``time.monotonic()`` to ``MARKER.stamp`` through a
    shared mapping (read with ``last_stamp``): after the child's death it holds when
    the job's code last ran, whenever the kernel got round to the exit itself.
    """
    grandchild = subprocess.Popen(["sleep", "60"])
    with open(f"{marker}.stamp", "w+b") as file:
        file.truncate(STAMP.size)
        stamps = mmap.mmap(file.fileno(), STAMP.size)
    write, now = STAMP.pack_into, time.monotonic
    write(stamps, 0, now())
    mark(marker, f"{os.getpid()} {grandchild.pid}")
    while True:
        write(stamps, 0, now())


def spin_with_grandchild_unalarmed(pctx: ProcessContext, marker: str) -> None:
    """``spin_with_grandchild`` with SIGALRM ignored: no kernel timer, only a watchdog's kill."""
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    spin_with_grandchild(pctx, marker)


def until_lost(pctx: ProcessContext, marker: str) -> None:
    """Mark, then compute until ``checkpoint()`` raises ``LeaseLost``."""
    mark(marker, str(os.getpid()))
    while True:
        pctx.checkpoint()


def until_moved(pctx: ProcessContext, marker: str, beyond: float) -> float:
    """Mark, then compute until ``remaining()`` exceeds ``beyond``; return it."""
    mark(marker, str(os.getpid()))
    while (left := pctx.remaining()) <= beyond:
        pctx.checkpoint()
    return left


def spin(pctx: ProcessContext, marker: str) -> None:
    """Mark, then compute forever without checking (only a kill stops it)."""
    mark(marker, str(os.getpid()))
    while True:
        pass


def allocate(pctx: ProcessContext, size: int) -> int:
    """Touch ``size`` bytes, return the child's pid."""
    block = bytearray(size)
    for index in range(0, size, 4096):
        block[index] = 1
    return os.getpid()


def big_result(pctx: ProcessContext, size: int) -> bytes:
    """Return ``size`` bytes, every page touched."""
    return b"x" * size


_KEPT: list[bytes] = []


def keep(pctx: ProcessContext, size: int) -> None:
    """Keep ``size`` bytes, every page touched, in the child for the calls after this one."""
    _KEPT.append(b"x" * size)


def kept(pctx: ProcessContext) -> bytes:
    """Return what :func:`keep` kept: no new page in the call, its result's pickle takes them."""
    return _KEPT[-1]


def drop(pctx: ProcessContext) -> None:
    """Let go of what :func:`keep` kept: the resident set shrinks without a page fault."""
    _KEPT.clear()


def pid(pctx: ProcessContext) -> int:
    """The child's pid."""
    return os.getpid()


def sleep_then_add(pctx: ProcessContext, seconds: float, a: int, b: int) -> int:
    """Sleep ``seconds``, then return ``a + b``."""
    time.sleep(seconds)
    return a + b


def outlive(pctx: ProcessContext, marker: str, moved: float, until: float) -> bool:
    """Mark; wait for a move past ``moved`` s; compute until under ``until`` s remain."""
    mark(marker, str(os.getpid()))
    while pctx.remaining() <= moved:
        pctx.checkpoint()
    while pctx.remaining() > until:
        pctx.checkpoint()
    return True


def hold_the_gil(pctx: ProcessContext, marker: str, seconds: int) -> None:
    """Mark, then call libc's sleep() without releasing the GIL (as a C extension can)."""
    mark(marker, str(os.getpid()))
    ctypes.PyDLL(None).sleep(seconds)


def hold_the_gil_with_grandchild(pctx: ProcessContext, marker: str, seconds: int) -> None:
    """Start a sleeping grandchild, mark "child grandchild" pids, then hold the GIL in sleep()."""
    grandchild = subprocess.Popen(["sleep", "60"])
    mark(marker, f"{os.getpid()} {grandchild.pid}")
    ctypes.PyDLL(None).sleep(seconds)


def lost_at_once(pctx: ProcessContext) -> bool:
    """Return whether the lease looked owned at the call's start (checkpoint() raises if not)."""
    owned = pctx.owned
    pctx.checkpoint()
    return owned


def returns_a_lock(pctx: ProcessContext) -> object:
    """Return what cannot be pickled."""
    return threading.Lock()
