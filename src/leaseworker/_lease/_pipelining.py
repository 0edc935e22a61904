"""Auto-pipelining: lease script calls that queue behind one in flight share the next trip.

A call made while nothing is in flight goes alone; calls made meanwhile go
together as one pipeline when it is answered, each still bounded by its own
deadline. Why (the event loop's CPU per call) and what it costs: see
docs/design.md#pipelining.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, final

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError

from ._deadlines import DeadlineWheel


@dataclass(slots=True)
class _Call:
    sha: str
    keys: Sequence[str]
    args: Sequence[str]
    answer: asyncio.Future[Any]


@final
class ScriptPipeline:
    """Runs Lua scripts by SHA, pipelining the calls that queue; see the module docstring.

    ``scripts`` maps each SHA to its source, loaded once when Redis answers
    NOSCRIPT (after a restart or ``SCRIPT FLUSH``). ``max_batch`` bounds one
    pipeline. A pipeline belongs to one event loop at a time; used on a new
    loop, it starts over.
    """

    def __init__(
        self,
        redis: Redis,
        scripts: Mapping[str, str],
        deadlines: DeadlineWheel,
        *,
        max_batch: int = 128,
    ) -> None:
        self._redis = redis
        self._scripts = dict(scripts)
        self._deadlines = deadlines
        self._max_batch = max_batch
        self._loop: asyncio.AbstractEventLoop | None = None
        self._busy = False  # a call or pipeline is in flight
        self._queued: list[_Call] = []
        self._senders: set[asyncio.Task[None]] = set()  # strong references while they run

    async def call(self, sha: str, keys: Sequence[str], args: Sequence[str]) -> Any:
        """Run the script ``sha`` with ``keys`` and ``args``; return its reply.

        Raises what redis-py raises for a lone call (``RedisError``,
        ``OSError``), and ``TimeoutError`` when a pipeline outlives the timeout.
        """
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new loop: the old one's calls and tasks are gone
            self._loop, self._busy, self._queued = loop, False, []
        if self._busy:
            answer: asyncio.Future[Any] = loop.create_future()
            self._queued.append(_Call(sha, keys, args, answer))
            return await answer  # cancelled with the caller: left out, or its answer dropped
        self._busy = True  # sent alone, on redis-py's plain path
        try:
            return await self._redis.evalsha(sha, len(keys), *keys, *args)
        except NoScriptError:
            await self._redis.script_load(self._scripts[sha])
            return await self._redis.evalsha(sha, len(keys), *keys, *args)
        finally:
            if self._queued:
                self._next()
            else:
                self._busy = False

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
        """Send the oldest queued calls (up to ``max_batch``) as one pipeline."""
        batch = [call for call in self._queued[: self._max_batch] if not call.answer.done()]
        del self._queued[: self._max_batch]
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
            replies = await self._deadlines.run(self._execute(batch))
        except BaseException as exc:  # the connection failed or timed out: every call in it did
            error = exc if isinstance(exc, Exception) else _stopped()
            for call in batch:
                _fail(call, error)
            if error is not exc:  # abandoned, or the loop is shutting down: keep unwinding
                raise
            return
        answered = True
        for call, reply in zip(batch, replies, strict=True):
            if call.answer.done():
                continue
            if isinstance(reply, Exception):
                call.answer.set_exception(reply)
            else:
                call.answer.set_result(reply)

    async def _execute(self, batch: list[_Call]) -> list[Any]:
        """Send ``batch``; calls answered NOSCRIPT are sent again once their script is loaded."""
        replies = await self._pipeline(batch)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            for sha in {batch[i].sha for i in missing}:
                await self._redis.script_load(self._scripts[sha])
            again = await self._pipeline([batch[i] for i in missing])
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        return replies

    async def _pipeline(self, batch: list[_Call]) -> list[Any]:
        pipe = self._redis.pipeline(transaction=False)
        for call in batch:
            pipe.evalsha(call.sha, len(call.keys), *call.keys, *call.args)
        return list(await pipe.execute(raise_on_error=False))


def _stopped() -> RedisConnectionError:
    return RedisConnectionError("the pipeline was cancelled before Redis answered")


def _fail(call: _Call, error: BaseException) -> None:
    """Fail one waiting call; each gets its own TimeoutError (callers tell timeouts apart)."""
    if call.answer.done():
        return
    if isinstance(error, TimeoutError):
        error = TimeoutError()
    call.answer.set_exception(error)
