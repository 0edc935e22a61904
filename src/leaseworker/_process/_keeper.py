"""The pool's keeper: kills every worker's group when the pod is gone, however it went.

Run by path with ``python -I -S`` (standard library only, no job code), in a
session of its own, with a pipe from the pod on stdin. The pod writes ``+PGID``
when a worker starts and ``-PGID`` once it reaped it; at end of file (the pod
exited, was killed, or closed the pool) the keeper SIGKILLs each group still
listed, then exits. Its own children are the pod's business only through this pipe.
"""

import contextlib
import os
import signal
import sys


def main() -> int:
    """Track the groups named on stdin; kill the ones left at its end."""
    groups: set[int] = set()
    for line in sys.stdin.buffer:
        sign, number = line[:1], int(line[1:])
        if sign == b"+":
            groups.add(number)
        else:
            groups.discard(number)
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
