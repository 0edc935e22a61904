"""Group commit (``_store/_group_commit.py``): pure unit tests with a fake ``run_batch``.

The fake runs in the worker thread like the SQLite one and blocks on a
``threading.Event`` the test controls, so "a batch is running" is a state the
test sets up, not a race it hopes to win. The real store's batching is tested
against SQLite in tests/store/test_store_sqlite.py.
"""

from __future__ import annotations

import threading

import anyio
import pytest

from leaseworker._store import Batcher, Call

WAIT = 5.0  # generous bound for each coordinated step


class FakeDatabase:
    """Fake ``run_batch``: records each batch's calls, answers each with its op's result.

    While ``gate`` is clear, a batch blocks in its worker thread after
    signalling ``entered``, so the test can queue calls behind it.
    """

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    async def run_batch(self, batch: list[Call[object]]) -> None:
        """Run :meth:`run_in_thread` in a worker thread, as the SQLite store does."""
        await anyio.to_thread.run_sync(self.run_in_thread, batch)

    def run_in_thread(self, batch: list[Call[object]]) -> None:
        """Record the batch, then answer it once the gate is open."""
        self.batches.append([str(call.op()) for call in batch])
        self.entered.set()
        assert self.gate.wait(WAIT)
        for call in batch:
            call.succeed(call.op())


def call(name: str, *, deadline: float = float("inf")) -> Call[str]:
    """Return a writing call whose op answers ``name``."""
    return Call(lambda: name, True, deadline)


async def wait_in_thread(event: threading.Event) -> None:
    """Wait for a threading event without blocking the loop."""
    assert await anyio.to_thread.run_sync(event.wait, WAIT)


async def start_blocked_batch(
    tg: anyio.abc.TaskGroup, db: FakeDatabase, batcher: Batcher, answers: dict[str, str]
) -> None:
    """Start a batch holding call ``first`` and leave it blocked in its thread."""
    db.gate.clear()
    tg.start_soon(submit, batcher, "first", answers)
    await wait_in_thread(db.entered)


async def submit(batcher: Batcher, name: str, answers: dict[str, str]) -> None:
    """Submit call ``name`` and note its answer."""
    answers[name] = await batcher.submit(call(name))


async def queue_behind_a_running_batch(
    db: FakeDatabase, batcher: Batcher, names: list[str]
) -> dict[str, str]:
    """Submit ``names`` while the batch of call ``first`` is running; return every answer."""
    answers: dict[str, str] = {}
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            await start_blocked_batch(tg, db, batcher, answers)
            for name in names:
                tg.start_soon(submit, batcher, name, answers)
            await anyio.wait_all_tasks_blocked()
            db.gate.set()
    return answers


async def test_fake_calls_queued_behind_a_running_batch_share_the_next_one() -> None:
    """Ten calls arriving while a batch runs are answered by one batch after it, not ten."""
    db = FakeDatabase()
    answers = await queue_behind_a_running_batch(
        db, Batcher(db.run_batch), [f"c{i}" for i in range(10)]
    )
    assert db.batches == [["first"], [f"c{i}" for i in range(10)]]
    assert answers == {name: name for name in ["first"] + [f"c{i}" for i in range(10)]}


async def test_fake_batches_are_capped_at_max_batch() -> None:
    """Calls beyond ``max_batch`` wait for the batch after; every call is answered once."""
    db = FakeDatabase()
    batcher = Batcher(db.run_batch, max_batch=4)
    answers = await queue_behind_a_running_batch(db, batcher, [f"c{i}" for i in range(6)])
    assert [len(batch) for batch in db.batches] == [1, 4, 2]
    assert len(answers) == 7


async def test_fake_caller_cancelled_while_queued_leaves_the_queue_unrun() -> None:
    """Cancelled before a batch took it: the call is never run and the caller returns at once."""
    db = FakeDatabase()
    batcher = Batcher(db.run_batch)
    answers: dict[str, str] = {}
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            await start_blocked_batch(tg, db, batcher, answers)
            with anyio.CancelScope() as scope:
                tg.start_soon(cancel_when_blocked, scope)
                await batcher.submit(call("dropped"))
            assert scope.cancelled_caught
            await submit_later(tg, batcher, "kept", answers)
            db.gate.set()
    assert "dropped" not in [name for batch in db.batches for name in batch]
    assert answers == {"first": "first", "kept": "kept"}


async def test_fake_caller_cancelled_after_its_call_was_taken_waits_for_the_answer() -> None:
    """The database may have acted: the cancelled caller returns only once its batch ended."""
    db = FakeDatabase()
    batcher = Batcher(db.run_batch)
    finished: list[str] = []

    async def lead_then_get_cancelled(scope: anyio.CancelScope) -> None:
        with scope:
            finished.append(await batcher.submit(call("taken")))
        finished.append("returned")

    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            db.gate.clear()
            scope = anyio.CancelScope()
            tg.start_soon(lead_then_get_cancelled, scope)
            await wait_in_thread(db.entered)
            scope.cancel()
            await anyio.wait_all_tasks_blocked()
            assert finished == []  # still waiting for the batch it is part of
            db.gate.set()
    assert finished[-1:] == ["returned"]  # with the answer, or the cancel after it
    assert db.batches == [["taken"]]


async def test_fake_failing_run_batch_answers_every_call_with_its_error() -> None:
    """A bug in ``run_batch`` reaches each caller as an exception, never a hang."""

    async def broken(batch: list[Call[object]]) -> None:
        raise RuntimeError("boom")

    batcher = Batcher(broken)
    with anyio.fail_after(WAIT):
        for _ in range(2):  # and the batcher still works afterwards
            with pytest.raises(RuntimeError, match="boom"):
                await batcher.submit(call("x"))


async def test_fake_close_waits_for_the_running_batch_and_goes_before_the_next() -> None:
    """``close`` never runs while a batch uses the connection."""
    db = FakeDatabase()
    batcher = Batcher(db.run_batch)
    events: list[str] = []
    answers: dict[str, str] = {}

    async def closer() -> None:
        events.append(f"closed after {len(db.batches)} batch(es)")

    async def close() -> None:
        await batcher.close(closer)

    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            await start_blocked_batch(tg, db, batcher, answers)
            tg.start_soon(close)
            await anyio.wait_all_tasks_blocked()
            assert events == []
            db.gate.set()
    assert events == ["closed after 1 batch(es)"]


async def test_fake_inline_batcher_runs_each_call_on_the_loop_at_once() -> None:
    """``inline`` (a private in-memory database): one call per batch, no worker thread."""
    threads: list[int] = []

    async def run_batch(batch: list[Call[object]]) -> None:
        threads.append(threading.get_ident())
        for item in batch:
            item.succeed(item.op())

    batcher = Batcher(run_batch, inline=True)
    assert await batcher.submit(call("a")) == "a"
    assert await batcher.submit(call("b")) == "b"
    assert threads == [threading.get_ident()] * 2


async def cancel_when_blocked(scope: anyio.CancelScope) -> None:
    """Cancel ``scope`` once every task waits."""
    await anyio.wait_all_tasks_blocked()
    scope.cancel()


async def submit_later(
    tg: anyio.abc.TaskGroup, batcher: Batcher, name: str, answers: dict[str, str]
) -> None:
    """Submit call ``name`` in a new task and return once it waits."""
    tg.start_soon(submit, batcher, name, answers)
    await anyio.wait_all_tasks_blocked()


async def test_fake_calls_made_in_one_pass_of_the_loop_share_the_first_batch() -> None:
    """Five calls started together, nothing running: one batch of five, not one and four.

    The leader waits one pass of the event loop before taking its batch, so
    the calls that tasks ready in that pass make join it.
    """
    db = FakeDatabase()
    batcher = Batcher(db.run_batch)
    answers: dict[str, str] = {}
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            for n in range(5):
                tg.start_soon(submit, batcher, f"c{n}", answers)
    assert db.batches == [[f"c{n}" for n in range(5)]]
    assert len(answers) == 5


async def test_fake_max_in_flight_runs_that_many_batches_at_once_and_queues_the_rest() -> None:
    """With ``max_in_flight=2`` a second batch starts beside a blocked one; a third call waits.

    The waiting call goes in the first batch to start after one of the two ends.
    """
    db = FakeDatabase()
    batcher = Batcher(db.run_batch, max_in_flight=2)
    answers: dict[str, str] = {}
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            await start_blocked_batch(tg, db, batcher, answers)
            db.entered.clear()
            tg.start_soon(submit, batcher, "second", answers)
            await wait_in_thread(db.entered)  # running beside the first
            assert db.batches == [["first"], ["second"]]
            await submit_later(tg, batcher, "third", answers)
            assert db.batches == [["first"], ["second"]]  # both slots taken: it queues
            db.gate.set()
    assert db.batches == [["first"], ["second"], ["third"]]
    assert answers == {"first": "first", "second": "second", "third": "third"}
