"""``ProcessPool``: warm child processes that run a job's synchronous work, killed on a cancel.

``run()`` pickles the call in the pod, takes a free worker, writes the call's
deadline into the worker's shared slot, lets the caller follow the lease through a
``Mirror``, and awaits the reply. A cancellation of the awaiting task (lease lost,
deadline, ``max_runtime``, shutdown) SIGKILLs the worker's process group at once and
reaps it within ``reap_timeout``, shielded; a child that died by itself raises
``ChildProcessDied``. Either way a new worker is started once the cancellation or
the error went on (``loop.call_soon``: starting a process blocks the loop about
5 ms), to warm up while the pool serves the next call with another worker.

Why ``subprocess`` and not ``multiprocessing``: the pod runs threads, so no
``fork``; ``spawn`` or ``forkserver`` would do, but bring a resource tracker
process, shared memory under /dev/shm and a bootstrap we would work around (a new
session, our own frames). A plain child started with ``start_new_session=True``,
pipes and a memfd passed by ``pass_fds`` give the pool what it needs (one process
group to kill, no tracker, nothing left in /dev/shm) and nothing more. The pool
is used from one thread (one loop) at a time: each worker's reply pipe stays
registered with the loop that last used it, and moves when another loop uses the pool.

A call takes the ready worker used last: its child's memory is the likeliest still
in the CPU's caches (one call at a time on two loaded cores, a no-op round trip took
67-76 µs so and 90-100 µs going round the workers, the pod's CPU per call 33-36 µs
against 44-49 µs).
"""

from __future__ import annotations

import asyncio
import atexit
import math
import os
import pickle
import time
from collections import deque
from collections.abc import Callable, Sequence
from types import FunctionType
from typing import Any, ClassVar, Final, TypeVar

import anyio

from .._errors import ChildProcessDied, ConfigError
from .._outcome import LeaseLostReason
from ._call import Identity, Mirror, Usage
from ._frames import COST
from ._pool_worker import CallMirror, Keeper, NotTaken, PoolWorker, died

T = TypeVar("T")

STOP_ALLOWANCE: Final = 0.05
"""Seconds from a cancellation to the child's group killed and reaped, with room to spare.

``bench/process_stop.py --kills 1000`` (cancel of the awaiting task to the killed
child reaped, a child in a CPU loop each time; 2 shared cores): p50 4.1 ms, p99
18.2 ms, max 33.7 ms at load 7 (6 December); a kill and its reap alone take about
1 ms. The allowance is the loaded maximum with half again on top.
"""

_NO_WORKERS: Final = (
    "run_in_process({}) has no process worker to run in: the pool has 0 "
    "(--process-workers 0, LEASEWORKER_PROCESS_WORKERS=0 or ProcessPool(0)); give it 1 or more"
)


class ProcessPool:
    """A pool of warm, supervised child processes for a job's synchronous, CPU-bound work.

    - ``workers``: how many children (default ``os.cpu_count()``); 0: none at all, and
      ``run()`` raises ``ConfigError`` (a pod whose job never calls ``run_in_process``).
    - ``max_tasks_per_child``: a worker is replaced after that many calls (default: never).
    - ``max_memory_per_child``: bytes; a worker whose call peaked above it is replaced
      after that call (default: never).
    - ``preload``: module names each worker imports once when it starts (the job's module).
    - ``reap_timeout``: seconds a killed child is waited for before the pool moves on.

    ``async with ProcessPool() as pool`` starts and closes it; ``run()`` starts it on
    first use. ``ProcessPool.default()`` is the one pool a process shares.
    """

    _default: ClassVar[ProcessPool | None] = None

    def __init__(
        self,
        workers: int | None = None,
        *,
        max_tasks_per_child: int | None = None,
        max_memory_per_child: int | None = None,
        preload: Sequence[str] = (),
        reap_timeout: float = 1.0,
    ) -> None:
        self._workers = _whole("workers", os.cpu_count() or 1 if workers is None else workers, 0)
        self._max_tasks = _optional("max_tasks_per_child", max_tasks_per_child)
        self._max_memory = _optional("max_memory_per_child", max_memory_per_child)
        if isinstance(preload, str) or not all(isinstance(name, str) for name in preload):
            raise ConfigError("preload must be a sequence of module names")
        self._preload = tuple(preload)
        if not (isinstance(reap_timeout, int | float) and 0 < reap_timeout < math.inf):
            raise ConfigError(
                f"reap_timeout must be a positive number of seconds: {reap_timeout!r}"
            )
        self._reap_timeout = float(reap_timeout)
        self._keeper: Keeper | None = None
        self._live: set[PoolWorker] = set()
        self._idle: deque[PoolWorker] = deque()
        self._dying: list[PoolWorker] = []
        self._waiters: deque[anyio.Event] = deque()
        self._starting: anyio.Event | None = None
        self._owed = 0  # workers to start again
        self._busy: set[PoolWorker] = set()  # running a call: its run() reaps it if it dies
        self._drained: anyio.Event | None = None  # set when the last busy worker is back

    @classmethod
    def default(cls) -> ProcessPool:
        """Return the process's shared pool, made on first use, closed at interpreter exit."""
        if cls._default is None:
            cls._default = cls()
            atexit.register(cls._default._close_now)
        return cls._default

    @property
    def workers(self) -> int:
        """How many child processes the pool runs."""
        return self._workers

    @property
    def stop_allowance(self) -> float:
        """Seconds a deadline must leave for a kill and its reap (measured; see STOP_ALLOWANCE)."""
        return STOP_ALLOWANCE

    async def __aenter__(self) -> ProcessPool:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Start every worker and the keeper, wait until each is ready; idempotent.

        ``ConfigError`` (one line, naming the module) if a preload module fails to import.
        A pool of 0 workers starts nothing, not even the keeper.
        """
        if not self._workers or (self._keeper is not None and self._starting is None):
            return
        if self._starting is not None:
            await self._starting.wait()
            await self.start()
            return
        self._starting = anyio.Event()
        try:
            self._keeper = Keeper()
            for _ in range(self._workers):
                self._spawn()
            for worker in list(self._idle):
                await worker.wait_ready()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.aclose()
            raise
        finally:
            self._starting.set()
            self._starting = None

    async def aclose(self) -> None:
        """Kill every worker's group, reap them, stop the keeper; idempotent.

        A call running meanwhile ends with ``ChildProcessDied`` (its child was killed);
        its ``run()`` reaps that child, and ``aclose`` waits for it. Cancelled while it
        waits, it still closes the keeper (which kills whatever is left) and wakes the
        calls waiting for a worker.
        """
        keeper, self._keeper = self._keeper, None  # nothing is started again meanwhile
        workers = [*self._live, *self._dying]
        self._live.clear()
        self._idle.clear()
        self._owed = 0
        for worker in workers:
            worker.kill()
        try:
            if self._busy:
                self._drained = anyio.Event()
                await self._drained.wait()
            for worker in [*workers, *self._dying]:
                if worker not in self._busy:
                    await worker.reap(self._reap_timeout)
            self._dying.clear()
        finally:
            if keeper is not None:
                keeper.close(self._reap_timeout)
            while self._waiters:
                self._waiters.popleft().set()

    def _close_now(self) -> None:
        """Interpreter exit: the same without an event loop."""
        workers = [*self._live, *self._dying]
        for worker in workers:
            worker.kill()
        give_up = time.monotonic() + self._reap_timeout
        for worker in workers:
            while not worker.gone() and time.monotonic() < give_up:
                time.sleep(0.002)
        if self._keeper is not None:
            self._keeper.close(self._reap_timeout)
            self._keeper = None
        self._live.clear()
        self._idle.clear()
        self._dying.clear()

    async def run(
        self,
        fn: Callable[..., T],
        args: tuple[object, ...],
        kwargs: dict[str, object],
        *,
        identity: Identity,
        deadline: float,
        lost: LeaseLostReason | None = None,
        follow: Callable[[Mirror], Callable[[], None]],
        usage: Callable[[Usage], None] | None = None,
    ) -> T:
        """Run ``fn(pctx, *args, **kwargs)`` in a worker and return its result.

        ``ConfigError`` (before any child is used) if the call cannot be pickled;
        ``fn``'s own exception, with the child's traceback as a note, if it raised;
        ``ChildProcessDied`` if the child died by itself. Cancelled: the worker's
        group is killed and reaped, then the cancellation goes on. ``usage`` is called
        once for every call a worker took, before ``run`` returns or raises. A call
        gives the loop one turn: its wait for the reply, or one after it.
        """
        if not self._workers:
            raise ConfigError(_NO_WORKERS.format(getattr(fn, "__qualname__", repr(fn))))
        data = _pickled(fn, args, kwargs, identity)
        # Followed before waiting for a worker: renewals meanwhile move the deadline.
        mirror = CallMirror(deadline, lost)
        unfollow = follow(mirror)
        try:
            gone = 0
            while True:
                worker = self._take_now() or await self._take()
                worker.follow(mirror)
                self._busy.add(worker)
                try:
                    reply = await self._call(worker, data, usage, last_try=gone >= self._workers)
                    break
                except NotTaken:
                    gone += 1  # it died idle (the OOM killer, a kill by hand): the next one
                finally:
                    self._busy.discard(worker)  # reaped if it died: aclose() waits for that
                    if not self._busy and self._drained is not None:
                        self._drained.set()
        finally:
            mirror.active = False
            unfollow()
        if not worker.waited:
            # The reply was there at once: the turn of the loop a wait gives, so calls in a
            # row never starve the pod's other tasks (a cancellation comes here, the call done).
            await asyncio.sleep(0)
        return _unpacked(reply, worker.pid)  # type: ignore[no-any-return]

    async def _call(
        self,
        worker: PoolWorker,
        data: bytes,
        usage: Callable[[Usage], None] | None,
        *,
        last_try: bool,
    ) -> tuple[Any, ...]:
        """Run the call on ``worker`` and return its reply.

        ``NotTaken`` (the worker dropped) if its child was gone before the call
        reached it; on the ``last_try``, ``ChildProcessDied`` instead.
        """
        try:
            body = await worker.call(data)
        except NotTaken:
            if not last_try:
                self._drop(worker)
                raise
            body = None
        except BaseException:
            with anyio.CancelScope(shield=True):
                cost = await self._kill(worker)
            _report(usage, cost)
            raise
        if body is None:
            with anyio.CancelScope(shield=True):
                died = await self._died(worker)
            _report(usage, died[1])
            raise died[0]
        cpu, peak, total = COST.unpack_from(body)
        worker.cpu_base = total
        if usage is not None:  # not _report(): no Usage built when nobody asks (the hot path)
            usage(Usage(cpu_seconds=cpu, peak_memory=peak, pid=worker.pid, killed=False))
        if self._spent(worker, peak) or worker not in self._live:  # or the pool closed meanwhile
            self._retire(worker)
        else:
            self._give_back(worker)
        try:
            return tuple(pickle.loads(memoryview(body)[COST.size :]))
        except Exception as exc:
            detail = f"{type(exc).__name__}: {exc}".splitlines()[0]
            raise RuntimeError(f"the pod cannot unpickle the child's reply: {detail}") from exc

    async def _kill(self, worker: PoolWorker) -> Usage:
        worker.kill()
        reaped = await worker.reap(self._reap_timeout)
        self._replace(worker, reaped is None)
        cpu, peak = _rusage_cost(worker, reaped)
        return Usage(cpu_seconds=cpu, peak_memory=peak, pid=worker.pid, killed=True)

    async def _died(self, worker: PoolWorker) -> tuple[ChildProcessDied, Usage]:
        worker.kill()  # what the job started dies with it
        reaped = await worker.reap(self._reap_timeout)
        self._replace(worker, reaped is None)
        cpu, peak = _rusage_cost(worker, reaped)
        error = died(worker.pid, None if reaped is None else reaped[0])
        return error, Usage(cpu_seconds=cpu, peak_memory=peak, pid=worker.pid, killed=False)

    def _spent(self, worker: PoolWorker, peak: int) -> bool:
        return (self._max_tasks is not None and worker.calls >= self._max_tasks) or (
            self._max_memory is not None and peak > self._max_memory
        )

    def _retire(self, worker: PoolWorker) -> None:
        worker.kill()  # idle: nothing of a call is lost
        self._replace(worker, not worker.gone())

    def _replace(self, worker: PoolWorker, unreaped: bool) -> None:
        self._live.discard(worker)
        if unreaped:
            self._dying.append(worker)
        if self._keeper is not None:
            # Starting a process blocks about 5 ms: after the cancellation went on, not before.
            self._owed += 1
            asyncio.get_running_loop().call_soon(self._pay)

    def _pay(self) -> None:
        while self._owed and self._keeper is not None:
            self._spawn()
            self._owed -= 1

    def _spawn(self) -> None:
        assert self._keeper is not None
        worker = PoolWorker(self._preload, self._keeper)
        self._live.add(worker)
        self._give_back(worker)

    def _give_back(self, worker: PoolWorker) -> None:
        if worker in self._live:
            self._idle.append(worker)
            if self._waiters:
                self._waiters.popleft().set()

    def _take_now(self) -> PoolWorker | None:
        """Return a ready worker of a started pool, without a wait (the usual case)."""
        if self._keeper is None or self._starting is not None:
            return None
        self._tidy()
        return self._warm()

    async def _take(self) -> PoolWorker:
        if self._keeper is None or self._starting is not None:
            await self.start()
        self._tidy()
        while True:
            worker = self._warm()
            if worker is not None:
                return worker
            if self._idle:  # only starting ones: wait for the oldest
                return await self._warmed(self._idle.popleft())
            if self._keeper is None:
                raise RuntimeError("the process pool is closed")
            free = anyio.Event()
            self._waiters.append(free)
            try:
                await free.wait()
            except BaseException:
                if free in self._waiters:
                    self._waiters.remove(free)
                elif self._idle and self._waiters:
                    self._waiters.popleft().set()  # pass on the wake-up this task will not use
                raise

    def _tidy(self) -> None:
        if self._owed:
            self._pay()  # if the loop closed before its callback ran
        if self._dying:
            self._reap_dying()

    def _warm(self) -> PoolWorker | None:
        """Take the ready worker used last: its child's memory is the likeliest still cached."""
        idle = self._idle
        for index in range(len(idle) - 1, -1, -1):
            worker = idle[index]
            try:
                ready = worker.poll_ready()
            except Exception:
                del idle[index]
                self._drop(worker)
                raise
            if ready:
                del idle[index]
                return worker  # one that died idle refuses the call (NotTaken): run() moves on
        return None

    async def _warmed(self, worker: PoolWorker) -> PoolWorker:
        try:
            await worker.wait_ready()
        except anyio.get_cancelled_exc_class():
            self._idle.appendleft(worker)
            raise
        except Exception:
            self._drop(worker)
            raise
        return worker

    def _drop(self, worker: PoolWorker) -> None:
        # A worker whose start failed: one new one is owed, so each call tries one start
        # (and raises its error) and none waits for a dead worker.
        worker.kill()
        self._replace(worker, not worker.gone())

    def _reap_dying(self) -> None:
        self._dying = [worker for worker in self._dying if not worker.gone()]


def _whole(name: str, value: object, least: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ConfigError(f"{name} must be a whole number >= {least}: {value!r}")
    return value


def _optional(name: str, value: object) -> int | None:
    return None if value is None else _whole(name, value)


_REFERENCES: dict[Callable[..., object], bytes] = {}
"""Plain functions' pickles (a reference: module and name), made once and sent as bytes.

Pickling a function looks its module up and checks the name still points at it,
about half of a no-op call's pickling in the pod; the child keeps the functions
it rebuilt by these bytes (``_child.Recent``). Cleared when it holds ``_MOST_REFERENCES``.
"""
_MOST_REFERENCES: Final = 1024


def _pickled(
    fn: Callable[..., object],
    args: tuple[object, ...],
    kwargs: dict[str, object],
    identity: Identity,
) -> bytes:
    head = (identity.job_key, identity.execution_id, identity.fence)
    plain = type(fn) is FunctionType  # pickled by reference; hashable
    sent: object = _REFERENCES.get(fn) if plain else None
    if sent is None:
        if getattr(fn, "__module__", None) == "__main__":
            raise ConfigError(
                f"{_name(fn)} is defined in __main__, which a process worker cannot import"
            )
        sent = _reference(fn) if plain else fn
    try:
        return pickle.dumps((head, sent, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        what = _unpicklable(fn, args, kwargs)
        detail = f"{type(exc).__name__}: {exc}".splitlines()[0]
        raise ConfigError(
            f"cannot send {what} of {_name(fn)} to a process worker: {detail}"
        ) from None


def _reference(fn: Callable[..., object]) -> object:
    """``fn``'s pickle, kept for the next call; ``fn`` itself if it cannot be pickled."""
    try:
        reference = pickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return fn  # the whole call's pickle fails next, and says why
    if len(_REFERENCES) >= _MOST_REFERENCES:
        _REFERENCES.clear()
    _REFERENCES[fn] = reference
    return reference


def _name(fn: object) -> str:
    return str(getattr(fn, "__qualname__", None) or repr(fn))


def _unpicklable(fn: object, args: tuple[object, ...], kwargs: dict[str, object]) -> str:
    parts: list[tuple[str, object]] = [("the function", fn)]
    parts += [(f"args[{index}]", arg) for index, arg in enumerate(args)]
    parts += [(f"kwargs[{key!r}]", value) for key, value in kwargs.items()]
    for what, value in parts:
        try:
            pickle.dumps(value)
        except Exception:
            return what
    return "a value"


def _unpacked(reply: tuple[Any, ...], pid: int) -> Any:
    if reply[0] == "returned":
        return reply[1]
    _, data, type_name, message, text = reply
    error: BaseException | None = None
    if data is not None:
        try:
            error = pickle.loads(data)
        except Exception:
            error = None
    if error is None:
        error = RuntimeError(f"{type_name}: {message}")
    error.add_note(f"raised in the job's child process (pid {pid}):\n{text.rstrip()}")
    raise error


def _rusage_cost(worker: PoolWorker, reaped: tuple[int, Any] | None) -> tuple[float, int]:
    if reaped is None:
        return 0.0, 0
    usage = reaped[1]
    cpu = usage.ru_utime + usage.ru_stime - worker.cpu_base
    return max(0.0, cpu), usage.ru_maxrss * 1024


def _report(usage: Callable[[Usage], None] | None, cost: Usage) -> None:
    if usage is not None:
        usage(cost)
