"""Auto-pipelining: lease script calls that queue behind one in flight share the next trip.

A call made while nothing is in flight goes alone; calls made meanwhile go
together as one pipeline when it is answered, each still bounded by its own
deadline. Once calls came together so (a poll's executions acquiring in one
loop pass), the next call made while idle first waits one loop pass, and the
calls made in it share its trip; one that found nobody resets that. A call
that can wait (a renewal) lingers a few milliseconds for others to share its
trip instead of going alone. Why (the event loop's CPU per call) and what it
costs: see docs/design.md#pipelining.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import final

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError

from ._deadlines import DeadlineWheel
from ._trips import Call, Command, OwnConnection, ReplicaWait, Replied


@dataclass(slots=True)
class _Call:
    """Calls of one script queued together: one caller's (one, or a held-lease batch)."""

    sha: str
    commands: list[Command]  # EVALSHA's words, one per call
    answer: asyncio.Future[list[Replied]]  # one reply per command, error replies as values


@final
class ScriptPipeline:
    """Runs Lua scripts by SHA, pipelining the calls that queue; see the module docstring.

    ``scripts`` maps each SHA to its source, all loaded at the front of a
    trip while the connection's server is not known to hold them (see
    ``_trips``). ``max_batch`` bounds the calls of one pipeline (a batch
    from :meth:`call_many` goes whole). With
    ``wait``, every trip (a lone call too) ends with one ``WAIT``, so each
    reply says how many replicas have its writes. A pipeline belongs to one
    event loop at a time; used on a new loop, it starts over.
    """

    def __init__(
        self,
        redis: Redis,
        scripts: Mapping[str, str],
        deadlines: DeadlineWheel,
        *,
        max_batch: int = 1024,
        wait: ReplicaWait | None = None,
    ) -> None:
        self._redis = redis
        self._wait = wait
        self._scripts = dict(scripts)
        self._deadlines = deadlines
        self._max_batch = max_batch
        self._loop: asyncio.AbstractEventLoop | None = None
        self._busy = False  # a call or pipeline is in flight, or a linger is pending
        self._queued: list[_Call] = []
        self._linger: asyncio.TimerHandle | None = None  # sends the lingering calls
        self._senders: set[asyncio.Task[None]] = set()  # strong references while they run
        self._own = OwnConnection(redis, self._scripts.values())  # for the calls that go alone
        self._company = False  # calls queued behind the last lone call: the next waits a pass

    async def call(
        self,
        sha: str,
        keys: Sequence[str],
        args: Sequence[str],
        *,
        replicated: bool = True,
        linger: float = 0.0,
    ) -> Replied:
        """Run the script ``sha`` with ``keys`` and ``args``; return its reply.

        Made while nothing is in flight it goes alone, after one loop pass when
        calls last came together (see the module docstring).
        ``replicated=False``: a lone call goes without its ``WAIT`` (a release:
        losing it in a failover costs availability, not safety); a queued one
        shares its pipeline's ``WAIT``. ``linger`` (seconds; renewals, which are
        not in a hurry): made while nothing is in flight, the call waits that
        long for others to share its trip, unless a call without linger comes
        first and takes it along at once. Raises what redis-py raises for a lone
        call (``RedisError``, ``OSError``), and ``TimeoutError`` when a
        pipeline outlives the timeout.
        """
        command: Command = ("EVALSHA", sha, len(keys), *keys, *args)
        if self._must_queue(linger):
            # Cancelled with the caller: left out, or its answer dropped.
            [reply] = await self._queue(sha, [command], linger)
            if isinstance(reply.value, Exception):
                raise reply.value
            return reply
        if self._company:
            shared = await self._gathered(sha, command)
            if shared is not None:
                [reply] = await shared
                if isinstance(reply.value, Exception):
                    raise reply.value
                return reply
        try:  # sent alone
            wait = self._wait if replicated else None
            return await self._own.run(command, wait)
        finally:
            self._company = bool(self._queued)
            self._idle()

    async def _gathered(self, sha: str, command: Command) -> asyncio.Future[list[Replied]] | None:
        """Wait one loop pass; if calls queued meanwhile, queue this one first and send them all.

        Returns the call's answer then, ``None`` when it is still alone (and goes so).
        Only after calls last came in company (a poll's executions acquiring
        together): a call that was alone last time goes at once.
        """
        try:
            await asyncio.sleep(0)
        except BaseException:
            self._idle()
            raise
        self._company = bool(self._queued)
        if not self._company:
            return None
        assert self._loop is not None
        answer: asyncio.Future[list[Replied]] = self._loop.create_future()
        self._queued.insert(0, _Call(sha, [command], answer))
        self._next()
        return answer

    async def call_many(
        self, sha: str, calls: Sequence[Call], *, replicated: bool = True
    ) -> list[Replied]:
        """Run the script ``sha`` once per ``(keys, args)`` of ``calls``, all in one trip.

        Error replies come back as values, one per call; the batch goes whole,
        at once if nothing is in flight, else with the next pipeline (taking
        lingering calls along). Its trip is bounded by the deadline from when
        it is written, not from this call: a batch waiting for the trip ahead
        of it, or for a busy loop, has not timed out. Raises as :meth:`call`
        does for the trip.
        """
        commands: list[Command] = [("EVALSHA", sha, len(k), *k, *a) for k, a in calls]
        if self._must_queue(0.0):
            return await self._queue(sha, commands, 0.0)
        try:  # sent alone
            wait = self._wait if replicated else None
            trip = self._execute([(sha, command) for command in commands], wait)
            return await self._deadlines.run(trip)
        finally:
            self._idle()

    def _must_queue(self, linger: float) -> bool:
        """Whether a call queues (one is in flight, or it lingers); if not, it goes alone now."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new loop: the old one's calls and tasks are gone
            self._loop, self._busy, self._queued, self._linger = loop, False, [], None
            self._company = False
            self._own = OwnConnection(self._redis, self._scripts.values())  # and its transport
        if self._busy or linger > 0:
            return True
        self._busy = True
        return False

    def _queue(
        self, sha: str, commands: list[Command], linger: float
    ) -> asyncio.Future[list[Replied]]:
        """Queue calls for the next pipeline; the future answers one reply per command."""
        assert self._loop is not None  # set by _must_queue
        answer: asyncio.Future[list[Replied]] = self._loop.create_future()
        self._queued.append(_Call(sha, commands, answer))
        if not self._busy:
            self._busy = True
            self._linger = self._loop.call_later(linger, self._lingered)
        elif self._linger is not None and not linger:
            self._linger.cancel()  # a call in a hurry: the lingering ones go with it now
            self._lingered()
        return answer

    def _idle(self) -> None:
        """End a lone call: send what queued meanwhile, or become idle."""
        if self._queued:
            self._next()
        else:
            self._busy = False

    async def aclose(self) -> None:
        """Stop the pipelines in flight (their callers get an error) before the client closes.

        A sender still running after its client closed would open a connection
        nobody closes.
        """
        if self._linger is not None:
            self._linger.cancel()
            self._lingered()  # sent, so that its callers get an answer or the sender's error
        senders = list(self._senders)
        for sender in senders:
            sender.cancel()
        if senders:
            await asyncio.wait(senders)
        await self._own.release()

    def _lingered(self) -> None:
        """End the linger: send what queued (a loop callback, or a call in a hurry)."""
        self._linger = None
        self._next()

    def _next(self) -> None:
        """Hand the connection on: send what queued meanwhile, or become idle."""
        if any(not call.answer.done() for call in self._queued):
            assert self._loop is not None
            sender = self._loop.create_task(self._send())
            self._senders.add(sender)
            sender.add_done_callback(self._senders.discard)
        else:
            self._queued.clear()
            self._busy = False

    async def _send(self) -> None:
        """Send the oldest queued calls (up to ``max_batch``, a batch whole) as one pipeline."""
        batch: list[_Call] = []
        taken = size = 0
        for call in self._queued:
            if batch and size + len(call.commands) > self._max_batch:
                break
            taken += 1
            if not call.answer.done():
                batch.append(call)
                size += len(call.commands)
        del self._queued[:taken]
        try:
            if batch:
                await self._answer(batch)
        finally:
            self._next()

    async def _answer(self, batch: list[_Call]) -> None:
        # A pipeline never outlives its callers: once every one of them gave up
        # (their own deadlines), it is abandoned, so the calls queued behind it go.
        sender = asyncio.current_task()
        assert sender is not None
        waiting = len(batch)
        answered = False

        def gone(_: object) -> None:
            nonlocal waiting
            waiting -= 1
            if waiting == 0 and not answered:
                sender.cancel()

        for call in batch:
            call.answer.add_done_callback(gone)
        try:
            commands = [(call.sha, command) for call in batch for command in call.commands]
            replies = await self._deadlines.run(self._execute(commands, self._wait))
        except BaseException as exc:  # the connection failed or timed out: every call in it did
            error = exc if isinstance(exc, Exception) else _stopped()
            for call in batch:
                _fail(call, error)
            if error is not exc:  # abandoned, or the loop is shutting down: keep unwinding
                raise
            return
        answered = True
        first = 0
        for call in batch:
            last = first + len(call.commands)
            if not call.answer.done():
                call.answer.set_result(replies[first:last])
            first = last

    async def _execute(
        self, commands: list[tuple[str, Command]], wait: ReplicaWait | None
    ) -> list[Replied]:
        """Send ``(sha, command)`` pairs; NOSCRIPT answers (a flush) go again, the loads first."""
        own = self._own
        since = time.monotonic()
        replies = await own.trip([command for _, command in commands], wait)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply.value, NoScriptError)]
        if missing:
            own.loaded = False
            again = await own.trip([commands[i][1] for i in missing], wait and wait.left(since))
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        return replies


def _stopped() -> RedisConnectionError:
    return RedisConnectionError("the pipeline was cancelled before Redis answered")


def _fail(call: _Call, error: BaseException) -> None:
    """Fail one waiting call; each gets its own TimeoutError (callers tell timeouts apart)."""
    if call.answer.done():
        return
    if isinstance(error, TimeoutError):
        error = TimeoutError()
    call.answer.set_exception(error)
