"""The shared-memory slot a worker's child reads its lease news from, without a round trip.

One slot per worker: a memfd the pod maps and passes to the child (``pass_fds``),
40 bytes on the monotonic clock, which Linux shares between processes::

    0   done      u64   sequence number, written last by the pod
    8   deadline  f64   the local deadline (time.monotonic())
    16  lost      u64   0, or 1 + the index of the LeaseLostReason (ownership uncertain for good)
    24  lost_at   f64   when the loss was pushed (time.monotonic())
    32  begun     u64   sequence number, written first by the pod

The pod is the only writer. A write bumps ``begun``, stores the fields, then sets
``done`` to the same number; the child reads all five in one ``unpack_from``
(ascending addresses) and keeps the read only when ``done == begun``, so it never acts
on a torn or half-written deadline (a seqlock: no lock, no system call, the reader
retries at most while a write is under way). Each field is an aligned 8-byte word,
stored by one ``pack_into``; on x86-64, whose stores and loads are each kept in
program order, the sequence check is enough. On weaker memory models the check
still catches a torn double in practice, and a stale read only delays one check.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from typing import Final, get_args

from .._outcome import LeaseLostReason

SIZE: Final = 40
_ALL: Final = struct.Struct("<QdQdQ")
_SEQ: Final = struct.Struct("<Q")
_FIELDS: Final = struct.Struct("<dQd")
REASONS: Final[tuple[LeaseLostReason, ...]] = get_args(LeaseLostReason)


def create() -> tuple[int, mmap.mmap]:
    """Create a slot: its memfd (inheritable only through ``pass_fds``) and the pod's mapping."""
    fd = os.memfd_create("leaseworker-slot", os.MFD_CLOEXEC)
    os.ftruncate(fd, SIZE)
    return fd, mmap.mmap(fd, SIZE)


class SlotWriter:
    """The pod's side of one slot: writes a call's deadline and its loss."""

    __slots__ = ("_map", "_seq")

    def __init__(self, shared: mmap.mmap) -> None:
        self._map = shared
        self._seq = 0

    def write(self, deadline: float, lost: LeaseLostReason | None = None) -> None:
        """Store ``deadline`` and the loss (``None``: owned) as one consistent record."""
        code = 0 if lost is None else REASONS.index(lost) + 1
        self._store(deadline, code, time.monotonic() if code else 0.0)

    def move(self, deadline: float) -> None:
        """Move the deadline, keeping a loss already written."""
        _, _, code, lost_at, _ = _ALL.unpack_from(self._map)
        self._store(deadline, code, lost_at)

    def lose(self, reason: LeaseLostReason) -> None:
        """Mark ownership lost for good (the first reason stays)."""
        _, deadline, code, _lost_at, _ = _ALL.unpack_from(self._map)
        if not code:
            self._store(deadline, REASONS.index(reason) + 1, time.monotonic())

    def _store(self, deadline: float, code: int, lost_at: float) -> None:
        self._seq += 1
        _SEQ.pack_into(self._map, 32, self._seq)
        _FIELDS.pack_into(self._map, 8, deadline, code, lost_at)
        _SEQ.pack_into(self._map, 0, self._seq)


def read(shared: mmap.mmap) -> tuple[float, int, float]:
    """Read (deadline, lost code, lost_at) from one consistent record: the child's side."""
    while True:
        done, deadline, code, lost_at, begun = _ALL.unpack_from(shared)
        if done == begun:
            return deadline, code, lost_at
