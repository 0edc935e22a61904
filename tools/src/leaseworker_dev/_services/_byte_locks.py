"""Machine-wide numbered reservations: ``lockf`` locks on the bytes of one file.

A process reserves number ``n`` (a port, a subnet) by locking byte ``n`` of a
shared file. The kernel drops a process's locks when it exits, however it
exits, so a reservation never outlives its holder. The file itself is removed
by the last holder to exit normally: at exit a process that can lock the whole
file (nobody else holds a byte of it) unlinks it. A process that opened the
file just before that unlink and locks a byte of the removed file notices, since
the path no longer names the file it locked, and starts over on a new one.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import os
import threading
from pathlib import Path
from typing import Final

_ATTEMPTS: Final = 8
"""Times :meth:`ByteLocks.take` reopens a file removed under it before it gives up."""


class ByteLocks:
    """The numbers this process holds on ``path``, one byte lock each.

    A ``lockf`` lock belongs to the process, so a second take in the same
    process would be granted again: ``held`` keeps those out, and ``lock``
    serializes takes among threads. The file stays open while anything is
    held (closing any descriptor of it would drop all of the process's locks).
    """

    def __init__(self, path: Path, mode: int) -> None:
        self.path = path
        self.mode = mode
        self.lock = threading.RLock()
        self.held: set[int] = set()
        self._fd: int | None = None
        atexit.register(self.remove_if_unused)
        os.register_at_fork(after_in_child=self.forget)

    def take(self, number: int) -> bool:
        """Reserve ``number`` unless this or another process has."""
        with self.lock:
            if number in self.held:
                return False
            for _ in range(_ATTEMPTS):
                fd = self._file()
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, number)
                except OSError as exc:
                    if exc.errno in (errno.EACCES, errno.EAGAIN):
                        return False
                    raise
                if self._current(fd):
                    self.held.add(number)
                    return True
                self._close()  # removed by its last holder: our lock on it reserves nothing
            raise RuntimeError(f"{self.path} kept being removed while a lock was taken on it")

    def give_back(self, number: int) -> None:
        """Drop the reservation of ``number`` (a port found taken, hosts torn down)."""
        with self.lock:
            if number in self.held and self._fd is not None:
                fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, number)
            self.held.discard(number)

    def forget(self) -> None:
        """In a forked child: it holds none of its parent's locks (the kernel's rule)."""
        self.lock = threading.RLock()
        self.held = set()

    def remove_if_unused(self) -> None:
        """At exit: drop this process's locks and remove the file if nobody else holds one."""
        with self.lock:
            fd, self._fd = self._fd, None
            self.held = set()
            if fd is None:
                return
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 0, 0)  # the whole file
                if self._current(fd):
                    with contextlib.suppress(OSError):  # another user's file in sticky /tmp
                        self.path.unlink()
            except OSError:
                pass  # another process holds a byte: it removes the file when it is the last
            finally:
                os.close(fd)

    def _current(self, fd: int) -> bool:
        """Whether ``path`` still names the file open on ``fd``."""
        opened = os.fstat(fd)
        try:
            named = os.stat(self.path)
        except FileNotFoundError:
            return False
        return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _file(self) -> int:
        if self._fd is None:
            try:  # without O_CREAT first: fs.protected_regular refuses it on another's file
                self._fd = os.open(self.path, os.O_RDWR)
            except FileNotFoundError:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, self.mode)
                with contextlib.suppress(OSError):
                    os.fchmod(self._fd, self.mode)  # past the umask
        return self._fd
