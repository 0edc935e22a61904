"""The pool's keeper: kills a worker's group once the worker is gone, and every group with the pod.

Run by path with ``python -I -S`` (standard library only, no job code), in a
session of its own, with a pipe from the pod on stdin. The pod writes ``+PGID``
when a worker starts and ``-PGID`` once it reaped it; a worker's pid is its
group's id. The keeper watches each worker on a pidfd and SIGKILLs its group as
soon as it exited, whoever ended it (the kernel timer, the OOM killer, a
segfault), so what the job started dies even when the pod cannot act (stopped,
its loop stuck). A worker gone before the keeper opened its pidfd has its group
killed at once. At end of file (the pod exited, was killed, or closed the pool)
the keeper SIGKILLs each group still listed, then exits. Its own children are
the pod's business only through this pipe.

Linux does not reuse a pid while a process is in the group of that id, so a kill
reaches only the worker's own group, or nobody. The one exception: the pod reaped
the worker and its group was empty, and a new session leader took the pid before
the keeper read ``-PGID``; the kill is skipped when ``/proc`` shows the pid started
at another time than the worker.
"""

import contextlib
import os
import select
import signal
import sys

Groups = dict[int, int | None]  # group: its leader's pidfd (None: the group was killed)


def main() -> int:
    """Track the groups named on stdin; kill each once its leader exited, the rest at EOF."""
    watched: dict[int, tuple[int, str | None]] = {}  # pidfd: (group, its leader's start time)
    groups: Groups = {}
    stdin = sys.stdin.fileno()
    pending = b""
    while True:
        ready, _, _ = select.select([stdin, *watched], [], [])
        seen = dict(watched)  # a pidfd closed below may come back as another worker's
        if stdin in ready:  # first: a worker the pod reaped meanwhile is not killed
            data = os.read(stdin, 65536)
            if not data:
                break
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                _heard(line, watched, groups)
        for fd in ready:
            if fd != stdin and fd in watched and watched[fd] is seen[fd]:
                group, started = watched.pop(fd)
                os.close(fd)
                groups[group] = None
                if started is None or _started(group) in (None, started):
                    _kill(group)
    for group, fd in groups.items():
        if fd is not None:  # the others were killed when their leader exited
            _kill(group)
    return 0


def _heard(line: bytes, watched: dict[int, tuple[int, str | None]], groups: Groups) -> None:
    """Follow one line of the pod: ``+PGID`` (watch it) or ``-PGID`` (forget it)."""
    sign, group = line[:1], int(line[1:])
    if sign == b"-":
        fd = groups.pop(group, None)
        if fd is not None:
            del watched[fd]
            os.close(fd)
        return
    started = _started(group)
    try:
        fd = os.pidfd_open(group)
    except ProcessLookupError:  # gone (and reaped) already: kill what it left
        _kill(group)
        groups[group] = None
        return
    watched[fd] = (group, started)
    groups[group] = fd


def _started(pid: int) -> str | None:
    """Return the start time of process ``pid`` (``/proc/PID/stat`` field 22), None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[19].decode()
    except (OSError, IndexError):
        return None


def _kill(group: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
