"""A wall clock the test steps while a service runs: an ``LD_PRELOAD`` shim of our own.

Redis expires keys at absolute unix-ms times read from its wall clock
(``CLOCK_REALTIME`` through ``gettimeofday``), so a step of that clock on the
Redis host expires a lease early (forward) or keeps it past its TTL
(backward). :class:`WallClock` reproduces such a step for one process:
``deploy/local/clockshift/clockshift.c``, built once with the system's C
compiler and cached, shifts that process's ``CLOCK_REALTIME``,
``gettimeofday`` and ``time`` by the 8 bytes of a file the test rewrites;
the monotonic clocks are untouched.

Not libfaketime: Debian's ``redis-server`` is linked with jemalloc, and under
libfaketime (0.9.10, with ``FAKETIME_TIMESTAMP_FILE`` and
``FAKETIME_NO_CACHE=1``) it hangs at start-up, before it listens
(libfaketime issue 130). Not a time namespace: ``unshare --time`` offsets
only ``CLOCK_MONOTONIC`` and ``CLOCK_BOOTTIME``, never ``CLOCK_REALTIME``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from ._proc import cache_dir, run_captured
from ._shipped import ToolMissingError, shipped

SHIFT_VARIABLE = "LEASEWORKER_CLOCK_SHIFT_FILE"
"""The variable naming the shift file to the shim."""

_SOURCE = "deploy/local/clockshift/clockshift.c"
_SHIFT = struct.Struct("=q")  # nanoseconds, native int64, as the shim reads it


@dataclass
class WallClock:
    """The wall clock of the processes started with :meth:`env`, stepped by :meth:`step`.

    The shift starts at 0; every step adds to it and is seen by the next clock
    read of every such process (the file is mapped shared, not re-read).
    """

    library: Path
    shift_file: Path
    _shift_ns: int = 0

    @classmethod
    def create(cls, directory: Path) -> Self:
        """Build (or find cached) the shim and write a zero shift file in ``directory``."""
        shift_file = directory / "clock-shift"
        shift_file.write_bytes(_SHIFT.pack(0))
        return cls(library=shim_library(), shift_file=shift_file)

    @property
    def shift(self) -> float:
        """Seconds the wall clock is ahead of the real one (negative: behind)."""
        return self._shift_ns / 1e9

    def env(self) -> dict[str, str]:
        """Return the environment to start a shifted process with (this one's, plus the preload)."""
        preload = " ".join(filter(None, [str(self.library), os.environ.get("LD_PRELOAD", "")]))
        return {**os.environ, "LD_PRELOAD": preload, SHIFT_VARIABLE: str(self.shift_file)}

    def step(self, seconds: float) -> None:
        """Step the wall clock by ``seconds`` (forward if positive), at once."""
        self._shift_ns += round(seconds * 1e9)
        fd = os.open(self.shift_file, os.O_WRONLY)
        try:
            os.pwrite(fd, _SHIFT.pack(self._shift_ns), 0)
        finally:
            os.close(fd)


def shim_library() -> Path:
    """Return the built shim, compiling it into the cache once per source version."""
    source = shipped(_SOURCE)
    text = source.read_bytes()
    target = cache_dir("clockshift") / f"libclockshift-{hashlib.sha256(text).hexdigest()[:16]}.so"
    if target.exists():
        return target
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise ToolMissingError("no C compiler (cc) to build the clock-step shim; install gcc")
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    argv = [compiler, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(partial), str(source)]
    done = run_captured(argv, cwd=target.parent, timeout=120)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        output = done.stdout.decode(errors="replace").strip()
        raise RuntimeError(f"building the clock-step shim failed: {output}")
    partial.replace(target)
    return target
