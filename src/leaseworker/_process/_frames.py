"""Length-prefixed frames over pipes: an 8-byte little-endian length, then a pickle.

The pod's ends are non-blocking and awaited with ``anyio.wait_readable`` /
``wait_writable`` on the raw descriptor, so a pool holds no object bound to one
event loop; the child's ends block (its main thread has nothing else to do).
"""

from __future__ import annotations

import os
import struct
from typing import Final

import anyio

_LENGTH: Final = struct.Struct("<Q")
_CHUNK: Final = 1 << 16


def frame(body: bytes) -> bytes:
    """``body`` with its length in front."""
    return _LENGTH.pack(len(body)) + body


async def send(fd: int, data: bytes) -> None:
    """Write all of ``data`` (a frame) to the non-blocking ``fd``."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            await anyio.wait_writable(fd)


async def receive(fd: int, buffer: bytearray) -> bytes | None:
    """Return the next frame's body from the non-blocking ``fd`` (``None`` at end of file).

    ``buffer`` keeps bytes read past a frame, and a partial frame across a
    cancellation, for the next call.
    """
    while True:
        body = _take(buffer)
        if body is not None:
            return body
        try:
            chunk = os.read(fd, _CHUNK)
        except BlockingIOError:
            await anyio.wait_readable(fd)
            continue
        if not chunk:
            return None
        buffer += chunk


def receive_now(fd: int, buffer: bytearray) -> bytes | None:
    """Return a frame already readable from the non-blocking ``fd`` (else ``None``, no wait).

    Raises ``EOFError`` when the other end closed before a whole frame came.
    """
    body = _take(buffer)
    while body is None:
        try:
            chunk = os.read(fd, _CHUNK)
        except BlockingIOError:
            return None
        if not chunk:
            raise EOFError
        buffer += chunk
        body = _take(buffer)
    return body


def _take(buffer: bytearray) -> bytes | None:
    if len(buffer) < _LENGTH.size:
        return None
    (size,) = _LENGTH.unpack_from(buffer)
    end = _LENGTH.size + size
    if len(buffer) < end:
        return None
    body = bytes(buffer[_LENGTH.size : end])
    del buffer[:end]
    return body


def read_blocking(fd: int) -> bytes | None:
    """Return the next frame's body from the blocking ``fd`` (``None`` at end of file)."""
    head = _read_exactly(fd, _LENGTH.size)
    if head is None:
        return None
    (size,) = _LENGTH.unpack(head)
    return _read_exactly(fd, size)


def write_blocking(fd: int, body: bytes) -> None:
    """Write ``body`` as one frame to the blocking ``fd``."""
    view = memoryview(frame(body))
    while view:
        view = view[os.write(fd, view) :]


def _read_exactly(fd: int, size: int) -> bytes | None:
    parts: list[bytes] = []
    left = size
    while left:
        chunk = os.read(fd, min(left, _CHUNK * 16))
        if not chunk:
            return None
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)
