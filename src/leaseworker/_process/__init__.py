"""The pool of supervised child processes a job's synchronous, CPU-bound work runs in.

``_pool``: ``ProcessPool`` (take a worker, run a call, kill on cancel, replace);
``_pool_worker``: one worker seen from the pod (its process, pipes, slot) and the keeper;
``_child``: the child's main loop, its watchdog and kernel timer;
``_keeper``: the process that kills the workers' groups when the pod is gone;
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
  the deadline: the child alone, with no Python involved; the job's own processes
  then live until the pod or the keeper kills the group;
- ``PR_SET_PDEATHSIG``: the kernel kills the child when the pod thread that started
  it ends (the pod's event loop thread); the keeper process kills the groups when
  the pod's pipe closes (the pod gone, however).

A C extension that holds the child's GIL delays only its watchdog thread (the kernel
timer then acts, and the pod's kill needs no GIL of the child); job code can still
replace SIGALRM's action or the timer itself, or block SIGALRM, leaving the watchdog
and the pod; effects sent before the kill stay sent (fences and the outbox cover those).
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
