"""The pool of supervised child processes a job's synchronous, CPU-bound work runs in.

``_pool``: ``ProcessPool`` (take a worker, run a call, kill on cancel, replace);
``_pool_worker``: one worker seen from the pod (its process, pipes, slot) and the keeper;
``_child``: the child's main loop, its watchdog and kernel timer;
``_keeper``: the process that kills the workers' groups when the pod is gone;
``_context``: ``ProcessContext``, the lease as the child's function sees it;
``_slot``: the shared-memory deadline and loss flag; ``_frames``: pickle frames on pipes;
``_call``: ``Identity``, ``Usage`` and the ``Mirror`` protocol.
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
