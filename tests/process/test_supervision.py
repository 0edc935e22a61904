"""The pool's children stop without the pod: at their deadline, with their pod, on recycling."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from leaseworker import ChildProcessDied, ConfigError, ProcessPool
from leaseworker_dev._services import ExitWatch
from tests.process import jobs
from tests.process.util import IDENTITY, Call, marked
from tests.process_work import alive
from tests.processes import stats
from tests.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]


def children(parent: int) -> set[int]:
    """The pids whose parent is ``parent``, running now."""
    return {pid for pid, ppid, _ in stats() if ppid == parent and alive(pid)}


async def gone(*pids: int, within: float) -> None:
    """Return once none of ``pids`` runs; fail after ``within`` seconds."""

    async def dead() -> bool:
        return not any(alive(pid) for pid in pids)

    await eventually(dead, within=within)


def shm() -> set[str]:
    """The names in /dev/shm but PostgreSQL's segments (``PostgreSQL.<n>``).

    Every PostgreSQL server on the machine (another xdist worker's, another
    session's) makes and drops its dynamic shared memory there at any moment.
    """
    return {name for name in os.listdir("/dev/shm") if not re.fullmatch(r"PostgreSQL\.\d+", name)}


async def killed_while_the_loop_is_blocked(
    pool: ProcessPool, call: Call, marker: Path
) -> ChildProcessDied:
    """Run a job due in 0.4 s, block this loop past it; return how its child died.

    The job (``spin_with_grandchild_unalarmed``) starts a grandchild and ignores
    SIGALRM, so the kernel timer cannot win a race with a watchdog that a loaded
    machine runs late (the keeper would then kill the grandchild): both are dead
    when the loop comes back, by the child's own watchdog.
    """
    died: list[ChildProcessDied] = []

    async def run() -> None:
        try:
            await call.run(pool, jobs.spin_with_grandchild_unalarmed, str(marker), deadline=0.4)
        except ChildProcessDied as exc:
            died.append(exc)

    async with anyio.create_task_group() as group:
        group.start_soon(run)
        child, grandchild = (int(pid) for pid in (await marked(marker)).split())
        time.sleep(0.8)  # noqa: ASYNC251 - the point: the pod's loop cannot act
        assert not alive(child)
        assert not alive(grandchild)
    [exc] = died
    assert exc.signal == signal.SIGKILL
    return exc


async def test_the_watchdog_kills_the_group_while_the_pod_loop_is_blocked(tmp_path: Path) -> None:
    """Deadline passed, pod loop stuck: the child's watchdog killed its group (SIGKILL)."""
    call = Call()
    async with ProcessPool(1) as pool:
        await killed_while_the_loop_is_blocked(pool, call, tmp_path / "started")
    assert not call.usages[0].killed  # not by the pod: by its own watchdog


async def test_a_call_due_before_the_watchdogs_wake_up_wakes_it(tmp_path: Path) -> None:
    """A call due before the watchdog's next look is killed at its deadline by the watchdog.

    The first call's far deadline set the watchdog's sleep; the second, due sooner, dies
    with its grandchild all the same.
    """
    call = Call()
    async with ProcessPool(1) as pool:
        assert await call.run(pool, jobs.add, 1, 1, deadline=60.0) == 2
        await killed_while_the_loop_is_blocked(pool, call, tmp_path / "started")
    assert not call.usages[1].killed


async def test_a_watchdog_that_wakes_at_an_earlier_deadline_spares_a_later_call() -> None:
    """A call due later than the watchdog's next look outlives that look.

    The first call's near deadline set the watchdog's sleep; the second, still running when
    that deadline passes, returns.
    """
    call = Call()
    async with ProcessPool(1) as pool:
        assert await call.run(pool, jobs.add, 1, 1, deadline=0.2) == 2
        assert await call.run(pool, jobs.sleep_then_add, 0.5, 1, 2, deadline=5.0) == 3
    assert len({usage.pid for usage in call.usages}) == 1


@pytest.mark.parametrize("deadline", [0.05, 0.4])
async def test_a_child_idle_past_its_last_deadline_is_not_killed(deadline: float) -> None:
    """The kernel timer outlives a call, not the child's idleness: the next call runs on it.

    A call's timer stays armed when it returns (calls in a row re-arm nothing);
    the watchdog disarms it once the child is idle, ``_IDLE_LEAD`` (0.1 s) before
    the deadline, or at it when the call was due sooner. Here the child then idles
    past the deadline and the timer's 25 ms (SIGALRM would end it).
    """
    call = Call()
    async with ProcessPool(1) as pool:
        first = await call.run(pool, jobs.pid, deadline=deadline)
        assert isinstance(first, int)
        await anyio.sleep(deadline + 0.2)  # the subject: real time passing, the child idle
        assert await call.run(pool, jobs.pid, deadline=5.0) == first
    assert alive(first) is False


async def test_the_kernel_timer_kills_a_child_that_holds_the_gil(tmp_path: Path) -> None:
    """A C call holding the GIL past the deadline: ITIMER_REAL's SIGALRM ends the child."""
    marker = tmp_path / "started"
    async with ProcessPool(1) as pool:
        with pytest.raises(ChildProcessDied) as caught:
            await Call().run(pool, jobs.hold_the_gil, str(marker), 30, deadline=0.4)
    assert caught.value.signal == signal.SIGALRM


async def test_the_keeper_kills_the_group_of_a_child_the_kernel_timer_killed(
    tmp_path: Path,
) -> None:
    """The watchdog held off by the GIL, the pod's loop stuck: the keeper kills the grandchild.

    The kernel timer kills the child alone (SIGALRM); the keeper, watching the child's
    pidfd, kills its group within 100 ms of the child's death, with no help from the pod.
    """
    marker = tmp_path / "started"
    died: list[ChildProcessDied] = []

    async def run(pool: ProcessPool) -> None:
        try:
            await Call().run(pool, jobs.hold_the_gil_with_grandchild, str(marker), 30, deadline=0.4)
        except ChildProcessDied as exc:
            died.append(exc)

    async with ProcessPool(1) as pool, anyio.create_task_group() as group:
        group.start_soon(run, pool)
        child, grandchild = (int(pid) for pid in (await marked(marker)).split())
        # The point: the pod's loop cannot act (nor kill the group) while this polls.
        limit = time.monotonic() + 10.0
        while alive(child) and time.monotonic() < limit:
            time.sleep(0.002)  # noqa: ASYNC251
        dead = time.monotonic()
        assert not alive(child)
        while alive(grandchild) and time.monotonic() < dead + 0.1:
            time.sleep(0.002)  # noqa: ASYNC251
        assert not alive(grandchild)
    [exc] = died
    assert exc.signal == signal.SIGALRM  # the kernel timer, not the watchdog


async def test_a_moved_deadline_rearms_the_kernel_timer(tmp_path: Path) -> None:
    """After move(), the child computes past its first deadline and is not killed."""
    marker = tmp_path / "started"
    call = Call()
    async with ProcessPool(1) as pool, anyio.create_task_group() as group:

        async def move() -> None:
            await marked(marker)
            call.mirrors[0].move(time.monotonic() + 1.2)

        group.start_soon(move)
        assert await call.run(pool, jobs.outlive, str(marker), 0.9, 0.6, deadline=0.3) is True


async def test_max_tasks_per_child_recycles_the_worker() -> None:
    """After two calls the worker is replaced; the third runs on a new child."""
    call = Call()
    async with ProcessPool(1, max_tasks_per_child=2) as pool:
        first, second, third = [await call.run(pool, jobs.pid) for _ in range(3)]
    assert first == second != third
    assert isinstance(first, int)
    assert not alive(first)


async def test_max_memory_per_child_recycles_after_a_call_that_peaked_above() -> None:
    """A call that touched 160 MiB under a 128 MiB ceiling retires its worker; small ones do not."""
    call = Call()
    async with ProcessPool(1, max_memory_per_child=128 << 20) as pool:
        small = await call.run(pool, jobs.allocate, 1 << 20)
        assert await call.run(pool, jobs.allocate, 160 << 20) == small
        assert await call.run(pool, jobs.allocate, 1 << 20) != small
    assert call.usages[1].peak_memory > 160 << 20
    assert call.usages[2].peak_memory < 128 << 20


async def test_peak_memory_is_the_calls_own() -> None:
    """A small call after a big one on the same child reports its own peak (VmHWM reset)."""
    call = Call()
    async with ProcessPool(1) as pool:
        big = await call.run(pool, jobs.allocate, 160 << 20)
        assert await call.run(pool, jobs.allocate, 1 << 20) == big
    assert call.usages[0].peak_memory > 160 << 20
    assert call.usages[1].peak_memory < 128 << 20  # an interpreter with leaseworker: ~30 MiB


async def test_a_call_that_touched_no_new_page_reports_the_resident_set() -> None:
    """A call that allocates nothing reports the resident set it ran in as its peak.

    It runs after a call whose 64 MiB result was sent: that result and its reply are not in it.
    """
    call = Call()
    async with ProcessPool(1) as pool:
        assert len(await call.run(pool, jobs.big_result, 64 << 20)) == 64 << 20  # type: ignore[arg-type]
        assert await call.run(pool, jobs.add, 1, 2) == 3
    assert call.usages[0].peak_memory > 64 << 20
    assert 4 << 20 < call.usages[1].peak_memory < 64 << 20  # an interpreter with leaseworker


async def test_a_results_pickle_counts_in_its_call_not_in_the_next() -> None:
    """A call returning 64 MiB it already held peaks with its reply's pickle; the next does not.

    The call itself touches no new page, its reply's pickle takes 64 MiB: the
    next call, which touches none, reports the resident set with what is kept.
    """
    call = Call()
    async with ProcessPool(1) as pool:
        await call.run(pool, jobs.keep, 64 << 20)
        assert len(await call.run(pool, jobs.kept)) == 64 << 20  # type: ignore[arg-type]
        assert await call.run(pool, jobs.add, 1, 2) == 3
    assert call.usages[1].peak_memory > 128 << 20  # what is kept and its pickle
    assert 64 << 20 < call.usages[2].peak_memory < 128 << 20  # what is kept, not the pickle


async def test_memory_given_back_leaves_the_figure_after_the_next_reset() -> None:
    """Memory let go of without a page fault stays in the figure only until the next reset.

    The reset after a call that took no page fault is skipped while the last one
    is under 10 ms old; the first call to end later resets, the one after it
    reports the smaller resident set.
    """
    call = Call()
    async with ProcessPool(1) as pool:
        await call.run(pool, jobs.keep, 64 << 20)
        await call.run(pool, jobs.drop)
        await anyio.sleep(0.02)  # past the 10 ms: the next call's end resets
        await call.run(pool, jobs.add, 1, 2)
        await call.run(pool, jobs.add, 1, 2)
    assert call.usages[0].peak_memory > 64 << 20
    assert call.usages[3].peak_memory < 64 << 20


async def test_deadlines_microseconds_apart_do_not_wake_the_watchdog() -> None:
    """Calls whose deadline comes a microsecond earlier each time leave the watchdog asleep.

    ``hold()`` converts its deadline from the loop's clock at every call, so
    it jitters by microseconds; within a millisecond is on time, and a
    wake-up would cost each call a GIL hand-over. Its thread's context switches
    are read from /proc. The call that moves the deadline earlier wakes the
    thread, which a busy machine can keep from running until that call ended
    (here: a CPU hog where the thread runs, the thread at ``SCHED_IDLE``): it
    sleeps to that call's deadline all the same (it used to forget it then, and
    every later call woke it).
    """
    call = Call()
    due = time.monotonic() + 60
    async with ProcessPool(1) as pool:
        child = await pool.run(
            jobs.pid, (), {}, identity=IDENTITY, deadline=due + 30, follow=call.follow
        )
        assert isinstance(child, int)
        await eventually(lambda: _armed(child), within=5)  # it looked at the first call
        woken = _watchdog_switches(child)
        with _starved(_watchdog_thread(child)):
            await pool.run(jobs.pid, (), {}, identity=IDENTITY, deadline=due, follow=call.follow)

        async def looked() -> bool:
            return _watchdog_switches(child) > woken

        await eventually(looked, within=5)
        before = _watchdog_switches(child)
        for step in range(1, 51):
            await pool.run(
                jobs.pid, (), {}, identity=IDENTITY, deadline=due - step * 1e-6, follow=call.follow
            )
        assert _watchdog_switches(child) - before < 5


@contextlib.contextmanager
def _starved(tid: int) -> Iterator[None]:
    """Keep thread ``tid`` from running: on one CPU with a CPU hog, at ``SCHED_IDLE``."""
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(tid, {cpu})
    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(hog.pid, {cpu})
        yield
    finally:
        hog.kill()
        hog.wait()


def _watchdog_thread(pid: int) -> int:
    """The thread id of ``pid``'s thread other than its main one."""
    (tid,) = [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]
    return tid


def _watchdog_switches(pid: int) -> int:
    """The voluntary context switches of ``pid``'s thread other than its main one."""
    tid = _watchdog_thread(pid)
    for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise LookupError(tid)


async def _armed(pid: int) -> bool:
    """Whether the watchdog thread has woken once (it sleeps again afterwards)."""
    return _watchdog_switches(pid) >= 2


async def test_a_preload_that_fails_is_a_config_error_naming_it() -> None:
    """A preload module that cannot be imported: ConfigError at start, one line, no process left."""
    others = children(os.getpid())  # the session's services, when the whole suite runs
    pool = ProcessPool(1, preload=["tests.process.jobs", "tests.process.no_such_module"])
    with pytest.raises(ConfigError, match=r"'tests\.process\.no_such_module'") as caught:
        await pool.start()
    assert "\n" not in str(caught.value)
    assert children(os.getpid()) <= others


@pytest.mark.parametrize(
    ("setting", "value"),
    [("workers", -1), ("max_tasks_per_child", 0), ("max_memory_per_child", 0), ("reap_timeout", 0)],
)
def test_bad_settings_are_config_errors(setting: str, value: int) -> None:
    """Each bad value is refused at construction."""
    with pytest.raises(ConfigError, match=setting):
        ProcessPool(**{setting: value})  # type: ignore[arg-type]


async def test_aclose_leaves_no_process() -> None:
    """Every worker and the keeper are gone once aclose() returned; run() starts it again.

    Nothing is left in /dev/shm either (the slots are memfds, gone with their last holder).
    """
    shared = shm()
    others = children(os.getpid())  # the session's services, when the whole suite runs
    pool = ProcessPool(2)
    call = Call()
    assert await call.run(pool, jobs.add, 1, 2) == 3  # started on first use
    started = children(os.getpid()) - others
    assert len(started) == 3  # two workers, the keeper
    await pool.aclose()
    await pool.aclose()
    assert not any(alive(pid) for pid in started)
    assert await call.run(pool, jobs.add, 2, 2) == 4
    await pool.aclose()
    assert children(os.getpid()) <= others
    assert shm() <= shared


async def test_calls_wait_for_a_busy_worker() -> None:
    """Two calls on one worker: the second waits for the first and runs on the same child."""
    call = Call()
    async with ProcessPool(1) as pool, anyio.create_task_group() as group:
        results: list[object] = []

        async def one(a: int) -> None:
            results.append(await call.run(pool, jobs.sleep_then_add, 0.05, a, 1))

        group.start_soon(one, 1)
        group.start_soon(one, 2)
    assert sorted(results) == [2, 3]  # type: ignore[type-var]
    assert len({usage.pid for usage in call.usages}) == 1


def _pod(marker: Path, deadline: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.process.pod_script", str(marker), str(deadline)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )


async def test_a_killed_pod_takes_its_child_and_grandchild_along(tmp_path: Path) -> None:
    """Pod SIGKILLed mid-call: child (PDEATHSIG), grandchild, keeper (at EOF) gone within 1 s."""
    marker = tmp_path / "started"
    pod = _pod(marker, 30.0)
    try:
        child, grandchild = (int(pid) for pid in (await marked(marker, within=30)).split())
        helpers = children(pod.pid)
        assert child in helpers
        assert len(helpers) == 2  # the worker and the keeper
        pod.kill()
        await gone(child, grandchild, *helpers, within=1.0)
    finally:
        pod.kill()
        pod.wait()
        if pod.stdout is not None:
            pod.stdout.close()


async def test_a_stopped_pod_child_dies_by_its_deadline(tmp_path: Path) -> None:
    """Pod SIGSTOPped mid-call: the child's watchdog kills it and its grandchild at the deadline."""
    marker = tmp_path / "started"
    pod = _pod(marker, 2.0)
    try:
        child, grandchild = (int(pid) for pid in (await marked(marker, within=30)).split())
        assert pod.stdout is not None
        deadline = float(pod.stdout.readline())
        with ExitWatch() as watch:
            assert watch.add(child)
            pod.send_signal(signal.SIGSTOP)
            stopped = time.monotonic()
            assert alive(child)
            await gone(child, grandchild, within=5.0)
            died = watch.exited(child, within=5.0)  # the kernel's word, not this test's look
        # The job's code last ran after its pod stopped and by its deadline (the watchdog's
        # kill at it, the kernel timer's 25 ms later): no instruction of it after.
        assert stopped < jobs.last_stamp(marker) < deadline + 0.1
        # The kernel's own exit comes when the dying child is next scheduled: on a loaded
        # machine some scheduler periods later, but it comes.
        assert died is not None
        assert died < deadline + 1.0
    finally:
        pod.kill()
        pod.send_signal(signal.SIGCONT)
        pod.wait()
        if pod.stdout is not None:
            pod.stdout.close()


async def test_the_default_pool_is_closed_at_interpreter_exit() -> None:
    """A process that used ProcessPool.default() and just ended leaves no worker behind."""
    with anyio.fail_after(60):
        done = await anyio.run_process(
            [sys.executable, "-m", "tests.process.default_pool_script"], cwd=ROOT
        )
    assert not alive(int(done.stdout))
    assert b"Warning" not in done.stderr
