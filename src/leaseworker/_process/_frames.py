"""Length-prefixed frames over pipes: an 8-byte little-endian length, then a pickle.

The pod's ends are non-blocking. Its reply end is read by a :class:`Receiver`, a
reader registered with the asyncio loop the pool runs in and kept between calls
(registering and unregistering a descriptor costs two ``epoll_ctl`` and some 13 µs
of the loop's bookkeeping, more than the rest of a no-op call's pod side); a pool
used from another loop later moves it there. Its call end is written at once and
awaited with ``anyio.wait_writable`` only when the pipe is full. The child's ends
block (its main thread has nothing else to do).
"""

from __future__ import annotations

import asyncio
import os
import struct
from typing import Final

import anyio

_LENGTH: Final = struct.Struct("<Q")
_CHUNK: Final = 1 << 16
COST: Final = struct.Struct("<dQd")
"""A reply's head, before its pickle: the call's CPU seconds and peak bytes, the CPU total."""
_HEAD: Final = struct.Struct("<QdQd")  # the frame's length, then COST


def frame(body: bytes) -> bytes:
    """``body`` with its length in front."""
    return _LENGTH.pack(len(body)) + body


def write_now(fd: int, data: bytes | memoryview) -> memoryview:
    """Write what the non-blocking ``fd`` takes of ``data`` now; return the rest (often empty)."""
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except BlockingIOError:
        pass
    return view


async def send(fd: int, data: bytes | memoryview) -> None:
    """Write all of ``data`` to the non-blocking ``fd``, waiting while the pipe is full."""
    view = write_now(fd, data)
    while view:
        await anyio.wait_writable(fd)
        view = write_now(fd, view)


class Receiver:
    """Frames from the non-blocking reading end ``fd``, read as they come.

    Bytes read past a frame, and a partial frame across a cancellation, stay
    for the next call. :meth:`close` unregisters the reader (the descriptor is
    its owner's to close, after). ``waited``: whether the last :meth:`receive`
    waited for the loop (else its frame was there at once).
    """

    __slots__ = ("_buffer", "_eof", "_fd", "_loop", "_waiter", "waited")

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = bytearray()
        self._eof = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.waited = False

    def receive_now(self) -> bytes | None:
        """Return a frame already readable (else ``None``, no wait).

        Raises ``EOFError`` when the other end closed before a whole frame came.
        """
        body = _take(self._buffer)
        if body is None:
            self._fill()
            body = _take(self._buffer)
            if body is None and self._eof:
                raise EOFError
        return body

    async def receive(self) -> bytes | None:
        """Return the next frame's body (``None`` at end of file before a whole frame)."""
        self.waited = False
        while True:
            body = _take(self._buffer)
            if body is not None:
                return body
            if self._eof:
                return None
            loop = asyncio.get_running_loop()
            if self._loop is not loop:
                self._watch(loop)
            self._waiter = loop.create_future()
            self.waited = True
            try:
                await self._waiter
            finally:
                self._waiter = None

    def close(self) -> None:
        """Stop watching the descriptor."""
        self._unwatch()

    def _fill(self) -> None:
        """Read what the pipe holds now into the buffer; note its end."""
        while not self._eof:
            try:
                chunk = os.read(self._fd, _CHUNK)
            except BlockingIOError:
                return
            if not chunk:
                self._eof = True
                self._unwatch()  # readable for good from now on: the loop would spin
                return
            self._buffer += chunk
            if len(chunk) < _CHUNK:
                return  # a pipe gives all it holds: empty now

    def _readable(self) -> None:
        self._fill()
        waiter = self._waiter
        if waiter is not None and not waiter.done() and (self._eof or _whole(self._buffer)):
            waiter.set_result(None)

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        self._unwatch()
        loop.add_reader(self._fd, self._readable)
        self._loop = loop

    def _unwatch(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self._fd)


def _whole(buffer: bytearray) -> bool:
    return (
        len(buffer) >= _LENGTH.size and len(buffer) >= _LENGTH.size + _LENGTH.unpack_from(buffer)[0]
    )


def _take(buffer: bytearray) -> bytes | None:
    if len(buffer) < _LENGTH.size:
        return None
    (size,) = _LENGTH.unpack_from(buffer)
    end = _LENGTH.size + size
    if len(buffer) < end:
        return None
    with memoryview(buffer) as view:
        body = bytes(view[_LENGTH.size : end])
    del buffer[:end]
    return body


class BlockingReader:
    """Frames from the blocking ``fd``: the child's end, one ``read`` for a small frame."""

    __slots__ = ("_buffer", "_fd")

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = bytearray()

    def read(self) -> bytes | None:
        """Return the next frame's body (``None`` at end of file)."""
        while (body := _take(self._buffer)) is None:
            chunk = os.read(self._fd, _CHUNK)  # what a pipe holds; below malloc's mmap threshold
            if not chunk:
                return None
            self._buffer += chunk
        return body


def write_blocking(fd: int, body: bytes) -> None:
    """Write ``body`` as one frame to the blocking ``fd``."""
    _write_all(fd, memoryview(frame(body)))


def reply_head(cpu: float, peak: int, total: float, size: int) -> bytes:
    """Return a reply frame's length and ``COST``, to go before a pickle of ``size`` bytes."""
    return _HEAD.pack(COST.size + size, cpu, peak, total)


def write_reply(fd: int, head: bytes, payload: bytes) -> None:
    """Write a reply frame, ``head`` then ``payload``, to the blocking ``fd``.

    One ``writev`` and no copy of the payload: a large result's reply takes no
    pages beyond its pickle's, which the call's peak counts.
    """
    sent = os.writev(fd, (head, payload))
    if sent < len(head) + len(payload):  # cut short by a signal: the rest in plain writes
        _write_all(fd, memoryview(head + payload)[sent:])


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view) :]
