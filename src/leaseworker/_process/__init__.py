"""The pool of supervised child processes a job's synchronous, CPU-bound work runs in.

``_pool``: ``ProcessPool`` (take a worker, run a call, kill on cancel, replace);
``_pool_worker``: one worker seen from the pod (its process, pipes, slot) and the keeper;
``_child``: the child's main loop, its watchdog and kernel timer;
``_keeper``: the process that kills a worker's group once it exited, all with the pod;
``_context``: ``ProcessContext``, the lease as the child's function sees it;
``_slot``: the shared-memory deadline and loss flag; ``_frames``: pickle frames on pipes;
``_call``: ``Identity``, ``Usage`` and the ``Mirror`` protocol.

Who stops a child, and what each needs:

- the pod, on a cancellation: ``os.killpg(SIGKILL)`` of the child's group (the
  kernel does the killing; the pod's event loop must run to send it);
- the child's watchdog thread, at the deadline in shared memory: the same kill, from
  inside the group (needs the GIL once: a job computing in Python yields it within
  a switch interval, 5 ms);
- the kernel timer (``ITIMER_REAL``, SIGALRM at its default action), 25 ms after
  the deadline: the child alone, with no Python involved (its watchdog late, under
  load or held off by the GIL);
- the keeper process (standard library only, in a session of its own, so a stopped
  pod does not stop it): the group of a worker that exited, whatever ended it (the
  kernel timer, the OOM killer, a segfault), seen on the worker's pidfd; so the
  job's own processes die with the child even when the pod cannot act;
- ``PR_SET_PDEATHSIG``: the kernel kills the child when the pod thread that started
  it ends (the pod's event loop thread); the keeper kills every group when the
  pod's pipe closes (the pod gone, however).

Who kills the job's own processes (the grandchildren): the pod's kill and the
watchdog's, with the child; after the kernel timer, a crash or the pod's death, the
keeper, as soon as it sees the child gone.

A C extension that holds the child's GIL delays only its watchdog thread (the kernel
timer then acts, the keeper kills the group, and the pod's kill needs no GIL of the
child); job code can still replace SIGALRM's action or the timer itself, or block
SIGALRM, leaving the watchdog and the pod; effects sent before the kill stay sent
(fences and the outbox cover those).
"""

from ._call import Identity as Identity
from ._call import Mirror as Mirror
from ._call import Usage as Usage
from ._context import ProcessContext as ProcessContext
from ._pool import STOP_ALLOWANCE as STOP_ALLOWANCE
from ._pool import ProcessPool as ProcessPool
from ._waits import awaiting_children as awaiting_children

__all__ = [
    "STOP_ALLOWANCE",
    "Identity",
    "Mirror",
    "ProcessContext",
    "ProcessPool",
    "Usage",
    "awaiting_children",
]
